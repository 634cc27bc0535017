//! The WebAssembly entry point of the allocsim app. Thin: index.html, this entry and the build.
