//! `memtrace copy` of upstream's v3 test trace reproduces it byte for byte (FORMAT.md §10.6).
#![cfg(feature = "cli")]

use std::path::Path;

use memtrace_rs::trace::Reader;

#[test]
fn copy_of_ocamlopt_is_byte_identical() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ocamlopt.ctf");
    let original = std::fs::read(&path).unwrap();
    let copied = memtrace_rs::cli::copy::copy(Reader::open(&path).unwrap(), Vec::new()).unwrap();
    assert_eq!(copied.len(), original.len());
    if let Some(at) = copied.iter().zip(&original).position(|(a, b)| a != b) {
        panic!("copy differs from the original at byte {at}");
    }
}

#[test]
fn copies_of_older_versions_read_back_to_the_same_dump() {
    for name in ["ocamlopt-v2", "lists_and_sets-v1"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/{name}.ctf"));
        let dir = std::env::temp_dir().join(format!("memtrace-copy-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("copy.ctf");
        memtrace_rs::cli::copy::run(&path, &copy).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        memtrace_rs::cli::dump::run(&path, &mut a, &mut Vec::new()).unwrap();
        memtrace_rs::cli::dump::run(&copy, &mut b, &mut Vec::new()).unwrap();
        assert!(a == b, "dump of the copy of {name} differs from the original's");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
