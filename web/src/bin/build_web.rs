//! Builds the allocsim web site into a folder of static files: the wasm (built for
//! `wasm32-unknown-unknown` with the `web` profile), its JS glue (wasm-bindgen used as a
//! library, so no CLI needs installing), `index.html` and the engine's `worker.js`.
//!
//! Usage: `cargo run -p allocsim-web --bin build-web [-- --out DIR] [--dev]`
//! (default `web/dist`). Prints the wasm's size raw and gzip-compressed.

#[cfg(not(target_arch = "wasm32"))]
fn main() -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::path::PathBuf;
    use std::process::Command;

    use anyhow::{Context as _, bail};

    let web_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = web_dir
        .parent()
        .context("web/ has no parent")?
        .to_path_buf();
    let mut out = web_dir.join("dist");
    let mut profile = "web";
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(args.next().context("--out needs a folder")?),
            "--dev" => profile = "dev",
            "-h" | "--help" => {
                println!(
                    "build-web [--out DIR] [--dev]: builds the site into DIR (default web/dist)"
                );
                return Ok(());
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(&root)
        .args([
            "build",
            "-p",
            "allocsim-web",
            "--lib",
            "--target",
            "wasm32-unknown-unknown",
            "--profile",
            profile,
        ])
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!(
            "the wasm build failed (is the target installed? rustup target add wasm32-unknown-unknown)"
        );
    }
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let profile_dir = if profile == "dev" { "debug" } else { profile };
    let wasm = target_dir
        .join("wasm32-unknown-unknown")
        .join(profile_dir)
        .join("allocsim_web.wasm");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    wasm_bindgen_cli_support::Bindgen::new()
        .input_path(&wasm)
        .web(true)?
        .typescript(false)
        .out_name("allocsim_web")
        .generate(&out)
        .with_context(|| format!("wasm-bindgen on {}", wasm.display()))?;
    for f in ["index.html", "worker.js"] {
        std::fs::copy(web_dir.join("static").join(f), out.join(f))
            .with_context(|| format!("copying {f}"))?;
    }
    let bytes = std::fs::read(out.join("allocsim_web_bg.wasm"))?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&bytes)?;
    let gz = gz.finish()?;
    println!(
        "built {} (wasm {:.2} MB, gzip -9 {:.2} MB)",
        out.display(),
        bytes.len() as f64 / 1e6,
        gz.len() as f64 / 1e6
    );
    println!(
        "serve it with: cargo run -p allocsim-web --bin serve-web -- --dir {}",
        out.display()
    );
    Ok(())
}

#[cfg(target_arch = "wasm32")]
fn main() {}
