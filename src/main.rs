fn main() {
    println!("dagloop: the runtime is not built yet");
}
