//! With the `web-assets` feature, the built web site is embedded in the binary
//! (`cli/site.rs`, served by `allocsim serve`): this finds it — `ALLOCSIM_SITE_DIR`, else
//! `web/dist` (`build-web`'s default) — and says how to build it when it is missing.

use std::path::PathBuf;

/// The files `build-web` writes, all of which the viewer needs.
const FILES: [&str; 4] = [
    "index.html",
    "worker.js",
    "allocsim_web.js",
    "allocsim_web_bg.wasm",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ALLOCSIM_SITE_DIR");
    if std::env::var_os("CARGO_FEATURE_WEB_ASSETS").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dir = std::env::var_os("ALLOCSIM_SITE_DIR")
        .map_or_else(|| manifest.join("../web/dist"), PathBuf::from);
    let dir = dir.canonicalize().unwrap_or(dir);
    for f in FILES {
        let path = dir.join(f);
        assert!(
            path.is_file(),
            "the web-assets feature embeds the web site, but {} is missing: build the site first \
             (cargo run --release -p allocsim-web --bin build-web, which writes web/dist; or set \
             ALLOCSIM_SITE_DIR to a folder build-web wrote)",
            path.display()
        );
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rustc-env=ALLOCSIM_SITE_DIR={}", dir.display());
}
