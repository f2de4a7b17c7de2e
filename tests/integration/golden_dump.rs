//! `memtrace dump` of upstream's test traces equals upstream's own dump, byte for byte.
use std::io::Read;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn expected_dump(name: &str) -> Vec<u8> {
    let gz = std::fs::File::open(data(&format!("{name}.dump.txt.gz"))).unwrap();
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut text).unwrap();
    text
}

fn check(name: &str) {
    let mut out = Vec::new();
    let mut warn = Vec::new();
    memtrace_rs::analysis::dump(&data(&format!("{name}.ctf")), &mut out, &mut warn).unwrap();
    let want = expected_dump(name);
    if out != want {
        let (o, w) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&want));
        let first = o.lines().zip(w.lines()).position(|(a, b)| a != b);
        panic!(
            "dump of {name} differs at line {first:?} (got {} lines, want {})",
            o.lines().count(),
            w.lines().count()
        );
    }
    assert!(warn.is_empty(), "unexpected warnings: {}", String::from_utf8_lossy(&warn));
}

#[test]
fn dump_ocamlopt_v3() {
    check("ocamlopt");
}

#[test]
fn dump_ocamlopt_v2() {
    check("ocamlopt-v2");
}

#[test]
fn dump_lists_and_sets_v1() {
    check("lists_and_sets-v1");
}
