//! `memtrace copy` of upstream's v3 test trace reproduces it byte for byte (FORMAT.md §10.6).
use std::path::Path;

use memtrace_rs::trace::Reader;

#[test]
fn copy_of_ocamlopt_is_byte_identical() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ocamlopt.ctf");
    let original = std::fs::read(&path).unwrap();
    let copied = memtrace_rs::analysis::copy(Reader::open(&path).unwrap(), Vec::new()).unwrap();
    assert_eq!(copied.dropped, 0);
    let copied = copied.out;
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
        let file = std::fs::File::create(&copy).unwrap();
        let copied = memtrace_rs::analysis::copy(Reader::open(&path).unwrap(), file).unwrap();
        assert_eq!(copied.dropped, 0, "{name}: no event dropped");
        drop(copied.out);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        memtrace_rs::analysis::dump(&path, &mut a, &mut Vec::new()).unwrap();
        memtrace_rs::analysis::dump(&copy, &mut b, &mut Vec::new()).unwrap();
        assert!(a == b, "dump of the copy of {name} differs from the original's");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn location_code_zero_gets_a_location_event() {
    use memtrace_rs::trace::Location;
    use memtrace_rs::trace::{AllocSource, EventKind, Info, NewAlloc, Writer};
    use std::sync::Arc;

    let info = Info {
        sample_rate: 1e-3,
        word_size: 64,
        executable_name: b"test".to_vec(),
        host_name: b"host".to_vec(),
        runtime_params: Vec::new(),
        pid: 1,
        initial_domain: 0,
        start_time: 1_000_000,
        context: None,
    };
    let site =
        Location { filename: b"zero.rs"[..].into(), line: 7, start_char: 1, end_char: 2, defname: b"zero"[..].into() };
    let mut w = Writer::new(Vec::new(), &info).unwrap();
    let alloc = NewAlloc { length: 4, nsamples: 1, source: AllocSource::External, callstack: &[0, 42], drop: 0 };
    w.put_alloc(0, 1_000_001, &alloc, |code| if code == 0 { Arc::from(vec![site.clone()]) } else { Arc::from(vec![]) })
        .unwrap();
    let bytes = w.close().unwrap();
    let mut r = Reader::new(&bytes[..]).unwrap();
    let ev = r.next_event().unwrap().unwrap();
    let EventKind::Alloc(a) = ev.kind else { panic!("expected an alloc") };
    assert_eq!(a.backtrace, &[42, 0]);
    assert_eq!(ev.locations.get(0).unwrap(), &[site][..]);
}
