//! `allocsim serve [FILE] [--port N]`: the web viewer (embedded with the `web-assets`
//! feature, `site.rs`) on 127.0.0.1 with FILE open, for a GPU machine without a display:
//! `ssh -L` brings the port to a laptop's browser. A small HTTP/1.1 server on std (GET
//! and HEAD, one thread per connection); FILE is served at `/trace/NAME`, and `/` without
//! a query redirects to `/?trace=/trace/NAME`, which the web app opens at start.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;

use super::{Failure, site};

/// The port `allocsim serve` listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 8717;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A PyTorch snapshot to open in the viewer (checked before serving)
    file: Option<PathBuf>,
    /// The port on 127.0.0.1 (0: any free port)
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
}

/// FILE as the viewer fetches it.
struct Trace {
    /// The path it is served at, `/trace/NAME`.
    url: String,
    bytes: Vec<u8>,
}

pub fn run(a: &Args) -> Result<u8, Failure> {
    let Some(site) = site::SITE else {
        return Err(Failure::unavailable(site::HOW_TO_GET));
    };
    let trace = match &a.file {
        None => None,
        Some(path) => {
            let bytes = std::fs::read(path)
                .map_err(|e| Failure::bad_input(format!("{}: cannot read: {e}", path.display())))?;
            // Decoded and validated now: a file the viewer cannot open fails here, not
            // in the browser.
            allocsim_core::session::load(&bytes, None)
                .map_err(|e| Failure::bad_input(format!("{}: {e}", path.display())))?;
            let name = path
                .file_name()
                .map_or_else(|| "snapshot".into(), |n| url_safe(&n.to_string_lossy()));
            Some(Trace {
                url: format!("/trace/{name}"),
                bytes,
            })
        }
    };
    let listener = TcpListener::bind(("127.0.0.1", a.port)).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            Failure::bad_input(format!(
                "port {} on 127.0.0.1 is busy (another allocsim serve?): pick another with --port N",
                a.port
            ))
        } else {
            Failure::bad_input(format!("cannot listen on 127.0.0.1:{}: {e}", a.port))
        }
    })?;
    let port = listener
        .local_addr()
        .map_err(|e| Failure::bad_input(format!("cannot listen on 127.0.0.1: {e}")))?
        .port();
    let what = a
        .file
        .as_ref()
        .map_or_else(String::new, |f| format!(" with {} open", f.display()));
    crate::say!("allocsim: the viewer{what} at http://127.0.0.1:{port}/");
    crate::say!(
        "  on a remote machine, run on your own: ssh -L {port}:127.0.0.1:{port} {}",
        host_name()
    );
    crate::say!("  then open http://127.0.0.1:{port}/ there. Ctrl-C stops the server.");
    let state = Arc::new((site, trace));
    for stream in listener.incoming().flatten() {
        let state = Arc::clone(&state);
        std::thread::spawn(move || {
            let (site, trace) = &*state;
            // A client that goes away mid-answer is no error of ours.
            let _ = answer(stream, site, trace.as_ref());
        });
    }
    Ok(0)
}

/// This machine's name for the `ssh -L` line (`HOST` where it has none).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "HOST".into())
}

/// `name` with every character but ASCII letters, digits, `.`, `-` and `_` as `_`.
fn url_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The longest request line or header line read (longer ones end the connection).
const MAX_LINE: u64 = 8 * 1024;

/// Answers the requests of one connection (keep-alive) until the client closes it.
fn answer(stream: TcpStream, site: &[site::File], trace: Option<&Trace>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let Some(line) = read_line(&mut reader)? else {
            return Ok(());
        };
        // The headers are not needed: skip them.
        loop {
            match read_line(&mut reader)? {
                None => return Ok(()),
                Some(h) if h.trim().is_empty() => break,
                Some(_) => {}
            }
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
        let head = method == "HEAD";
        if method != "GET" && !head {
            respond(
                &mut out,
                "405 Method Not Allowed",
                &[("Content-Type", "text/plain")],
                b"only GET and HEAD",
                false,
            )?;
            continue;
        }
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        match (path, trace) {
            ("/" | "/index.html", Some(t)) if query.is_empty() => {
                let location = format!("/?trace={}", t.url);
                respond(
                    &mut out,
                    "302 Found",
                    &[("Location", &location), ("Content-Type", "text/plain")],
                    b"",
                    head,
                )?;
            }
            (p, Some(t)) if p == t.url => respond(
                &mut out,
                "200 OK",
                &[("Content-Type", "application/octet-stream")],
                &t.bytes,
                head,
            )?,
            _ => {
                let rel = path.trim_start_matches('/');
                let rel = if rel.is_empty() { "index.html" } else { rel };
                match site.iter().find(|(name, _)| *name == rel) {
                    Some((name, body)) => respond(
                        &mut out,
                        "200 OK",
                        &[("Content-Type", mime(name))],
                        body,
                        head,
                    )?,
                    None => respond(
                        &mut out,
                        "404 Not Found",
                        &[("Content-Type", "text/plain")],
                        b"not found",
                        head,
                    )?,
                }
            }
        }
    }
}

/// One line of the request, at most [`MAX_LINE`] bytes; `None` at the end of the stream.
fn read_line(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    let n = reader
        .by_ref()
        .take(MAX_LINE)
        .read_until(b'\n', &mut line)?;
    if n == 0 || !line.ends_with(b"\n") {
        return Ok(None);
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
}

fn respond(
    out: &mut TcpStream,
    status: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    head: bool,
) -> std::io::Result<()> {
    // The status line and headers in one write.
    let mut text = Vec::new();
    write!(text, "HTTP/1.1 {status}\r\n")?;
    for (k, v) in headers {
        write!(text, "{k}: {v}\r\n")?;
    }
    write!(
        text,
        "Content-Length: {}\r\nCache-Control: no-cache\r\n\r\n",
        body.len()
    )?;
    out.write_all(&text)?;
    if !head {
        out.write_all(body)?;
    }
    out.flush()
}

fn mime(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}
