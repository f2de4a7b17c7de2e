//! `--format json` of `info`, `hotspots` and `diff`: valid against the schemas in
//! `docs/json/`, and carrying the same figures as the text.
use std::path::Path;

use serde_json::Value;

use crate::util::cli::*;
use crate::util::schema;

fn json(dir: &Path, args: &[&str]) -> Value {
    serde_json::from_str(&memtrace_ok(dir, args)).unwrap()
}

fn assert_valid(name: &str, value: &Value) {
    let errors = schema::errors(&schema::load(name), value);
    assert!(errors.is_empty(), "{name}: {errors:#?}\n{value:#}");
}

#[test]
fn outputs_follow_their_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "known.ctf", &known_trace());
    write_trace(dir, "known-new.ctf", &known_trace_new());
    write_trace(dir, "empty.ctf", &TraceBuilder::new().finish());
    let ocamlopt = data("ocamlopt.ctf");
    let lists = data("lists_and_sets-v1.ctf");
    let traces = ["known.ctf", "empty.ctf", ocamlopt.to_str().unwrap(), lists.to_str().unwrap()];
    for t in traces {
        assert_valid("info", &json(dir, &["info", t, "--json"]));
        for extra in [&[][..], &["--stacks", "--by", "live-peak"], &["--by", "live-end", "--keep-allocator-frames"]] {
            let mut args = vec!["hotspots", t, "--format", "json"];
            args.extend(extra);
            assert_valid("hotspots", &json(dir, &args));
        }
    }
    for (base, new) in [("known.ctf", "known-new.ctf"), ("empty.ctf", "known.ctf"), ("known.ctf", traces[2])] {
        let gated = memtrace(dir, &["diff", base, new, "--json", "--fail-above", "5%"]);
        assert!(matches!(gated.status.code(), Some(0 | 3)), "{}", gated.stderr);
        let gated: Value = serde_json::from_str(&gated.stdout).unwrap();
        assert_valid("diff", &gated);
        assert_valid("diff", &json(dir, &["diff", base, new, "--json", "--stacks", "--per-second"]));
    }
}

#[test]
fn the_validator_rejects_what_the_schema_forbids() {
    let dir = tempfile::tempdir().unwrap();
    write_trace(dir.path(), "known.ctf", &known_trace());
    let good = json(dir.path(), &["info", "known.ctf", "--json"]);
    let info = schema::load("info");
    let mut extra = good.clone();
    extra["surprise"] = Value::Bool(true);
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("peak");
    let mut wrong = good.clone();
    wrong["allocated"]["samples"] = Value::String("11".into());
    for bad in [extra, missing, wrong] {
        assert!(!schema::errors(&info, &bad).is_empty(), "{bad:#}");
    }
}

#[test]
fn json_figures_match_the_known_trace() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "known.ctf", &known_trace());
    write_trace(dir, "known-new.ctf", &known_trace_new());
    let info = json(dir, &["info", "known.ctf", "--json"]);
    assert_eq!(info["origin"], "rust");
    assert_eq!(info["allocations"], 4);
    assert_eq!(info["frees"], 3);
    assert_eq!(info["ocaml"], Value::Null);
    assert_eq!(info["allocated"]["bytes"], 8800.0);
    assert_eq!(info["allocated"]["samples"], 11);
    assert_eq!(info["live_end"]["rough"], true);
    assert_eq!(info["peak"]["time_us"], 40);
    let low = info["allocated"]["low"].as_f64().unwrap();
    let high = info["allocated"]["high"].as_f64().unwrap();
    assert!(low < 8800.0 && 8800.0 < high, "{low} {high}");
    let ocaml = json(&data_dir(), &["info", "ocamlopt.ctf", "--json"]);
    assert_eq!((ocaml["origin"].as_str(), ocaml["ocaml"]["promotions"].as_u64()), (Some("ocaml"), Some(257)));

    let hot = json(dir, &["hotspots", "known.ctf", "--json"]);
    let sites = hot["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 2);
    assert_eq!(sites[0]["frames"][0]["function"], "app::parse");
    assert_eq!(sites[0]["estimate"]["bytes"], 5600.0);
    assert!((sites[0]["count"].as_f64().unwrap() - 200.0).abs() < 1e-9, "two allocations of 100 objects each");

    let diff = json(dir, &["diff", "known.ctf", "known-new.ctf", "--json", "--fail-above", "0"]);
    assert_eq!(diff["sites_changed"], 3);
    assert_eq!(diff["changes"][0]["frames"][0], "app::run (src/app.rs:20)");
    assert_eq!(diff["changes"][0]["beyond_noise"], true);
    assert_eq!(diff["total"]["change"], 2400.0);
    assert_eq!(diff["fail_above"]["exceeded"], false, "+2.3 KiB is within the noise of 11 and 14 samples");
}
