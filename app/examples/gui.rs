//! Opens the desktop app without the CLI: `cargo run -p allocsim-app --example gui [FILE]`.

fn main() -> std::process::ExitCode {
    match allocsim_app::gui::run_native(std::env::args_os().skip(1).map(Into::into).collect()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allocsim: {e}");
            std::process::ExitCode::from(3)
        }
    }
}
