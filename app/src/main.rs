//! The `allocsim` binary: the desktop app, or a command-line subcommand.

fn main() {
    println!("allocsim");
}
