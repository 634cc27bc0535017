//! The web viewer's files, embedded with the `web-assets` feature (`build.rs` finds the
//! site `build-web` wrote); without it, `allocsim serve` says how to get them.

/// One file of the site: its path under `/` and its bytes.
pub type File = (&'static str, &'static [u8]);

#[cfg(feature = "web-assets")]
macro_rules! embed {
    ($($name:literal),*) => {
        &[$(($name, include_bytes!(concat!(env!("ALLOCSIM_SITE_DIR"), "/", $name)))),*]
    };
}

/// The site, when this build embeds it.
#[cfg(feature = "web-assets")]
pub const SITE: Option<&[File]> = Some(embed!(
    "index.html",
    "worker.js",
    "allocsim_web.js",
    "allocsim_web_bg.wasm"
));

/// The site, when this build embeds it.
#[cfg(not(feature = "web-assets"))]
pub const SITE: Option<&[File]> = None;

/// What to do about a build without the site (`allocsim serve`'s exit-3 line).
pub const HOW_TO_GET: &str = "this build of allocsim has no web viewer: install the Python wheel \
     (pip install allocsim-*.whl), or build the site and a binary that embeds it \
     (cargo run --release -p allocsim-web --bin build-web && cargo install --path app --features web-assets)";
