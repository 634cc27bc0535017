//! Serves the built site locally (a minimal static HTTP/1.1 server: GET and HEAD, the
//! right MIME types for wasm and ES modules, nothing outside the folder).
//!
//! Usage: `cargo run -p allocsim-web --bin serve-web [-- --dir DIR] [--port N]`
//! (default `web/dist` on port 8080; `--port 0` picks a free one). Prints the URL.

#[cfg(not(target_arch = "wasm32"))]
fn main() -> anyhow::Result<()> {
    use std::net::TcpListener;
    use std::path::PathBuf;

    use anyhow::{Context as _, bail};

    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dist");
    let mut port = 8080u16;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => dir = PathBuf::from(args.next().context("--dir needs a folder")?),
            "--port" => {
                port = args
                    .next()
                    .context("--port needs a number")?
                    .parse()
                    .context("--port")?;
            }
            "-h" | "--help" => {
                println!(
                    "serve-web [--dir DIR] [--port N]: serves DIR (default web/dist) on http://127.0.0.1:N/"
                );
                return Ok(());
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if !dir.join("index.html").is_file() {
        bail!(
            "{} has no index.html: build the site first (cargo run -p allocsim-web --bin build-web)",
            dir.display()
        );
    }
    let dir = dir.canonicalize()?;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .with_context(|| format!("cannot listen on port {port}"))?;
    println!(
        "serving {} on http://127.0.0.1:{}/",
        dir.display(),
        listener.local_addr()?.port()
    );
    for stream in listener.incoming().flatten() {
        let dir = dir.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve::one(stream, &dir) {
                eprintln!("serve-web: {e}");
            }
        });
    }
    Ok(())
}

#[cfg(not(target_arch = "wasm32"))]
mod serve {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;
    use std::path::Path;

    /// Answers the requests of one connection (keep-alive).
    pub fn one(stream: TcpStream, dir: &Path) -> std::io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut out = stream;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            // Skip the headers.
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
                    break;
                }
            }
            let mut parts = line.split_whitespace();
            let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
            if method != "GET" && method != "HEAD" {
                respond(
                    &mut out,
                    "405 Method Not Allowed",
                    "text/plain",
                    b"only GET and HEAD",
                    false,
                )?;
                continue;
            }
            let path = target.split(['?', '#']).next().unwrap_or("/");
            let rel = path.trim_start_matches('/');
            let rel = if rel.is_empty() { "index.html" } else { rel };
            let file = dir.join(rel);
            // Nothing outside the folder (no `..`, no symlinks out of it).
            let inside = rel.split('/').all(|c| c != ".." && !c.is_empty())
                && file.canonicalize().is_ok_and(|f| f.starts_with(dir));
            match (inside, std::fs::read(&file)) {
                (true, Ok(body)) => {
                    respond(&mut out, "200 OK", mime(rel), &body, method == "HEAD")?;
                }
                _ => respond(
                    &mut out,
                    "404 Not Found",
                    "text/plain",
                    b"not found",
                    method == "HEAD",
                )?,
            }
        }
    }

    fn respond(
        out: &mut TcpStream,
        status: &str,
        mime: &str,
        body: &[u8],
        head: bool,
    ) -> std::io::Result<()> {
        write!(
            out,
            "HTTP/1.1 {status}\r\nContent-Type: {mime}\r\nContent-Length: {}\r\nCache-Control: no-cache\r\n\r\n",
            body.len()
        )?;
        if !head {
            out.write_all(body)?;
        }
        out.flush()
    }

    fn mime(path: &str) -> &'static str {
        match path.rsplit('.').next().unwrap_or("") {
            "html" => "text/html; charset=utf-8",
            "js" | "mjs" => "text/javascript; charset=utf-8",
            "wasm" => "application/wasm",
            "json" => "application/json",
            "png" => "image/png",
            "css" => "text/css",
            _ => "application/octet-stream",
        }
    }
}

#[cfg(target_arch = "wasm32")]
fn main() {}
