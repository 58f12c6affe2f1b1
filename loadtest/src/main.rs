fn main() {
    eprintln!("tandem-loadtest: scenarios are not built yet");
    std::process::exit(2);
}
