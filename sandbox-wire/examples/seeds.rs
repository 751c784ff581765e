//! Writes every sample of the corpus, as bytes (sent to `a.test`), into the folder given: the
//! fuzz targets' seeds (`cargo run -p sandbox-wire --example seeds -- fuzz/corpus/http1`).

fn main() {
    let Some(out) = std::env::args().nth(1) else {
        eprintln!("usage: seeds DIR");
        std::process::exit(64);
    };
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/http1");
    let samples = sandbox_wire::corpus::load(&corpus).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(65);
    });
    std::fs::create_dir_all(&out).expect("the seeds' folder");
    for sample in &samples {
        let bytes = sample.bytes("a.test").expect("checked by load");
        std::fs::write(std::path::Path::new(&out).join(&sample.name), bytes).expect("a seed written");
    }
    println!("{} seeds in {out}", samples.len());
}
