//! `--format json` of `info`, `hotspots` and `diff`: valid against the schemas in
//! `docs/json/`, and carrying the same figures as the text.
use std::path::Path;

use serde_json::Value;

use crate::cli_real_stacks::trace_run;
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
    assert_eq!(info["allocated"]["bytes"], 8800);
    assert_eq!(info["allocated"]["samples"], 11);
    assert_eq!(info["live_end"]["rough"], true);
    assert_eq!(info["peak"]["time_us"], 40);
    let low = info["allocated"]["low"].as_u64().unwrap();
    let high = info["allocated"]["high"].as_u64().unwrap();
    assert!(low < 8800 && 8800 < high, "{low} {high}");
    let ocaml = json(&data_dir(), &["info", "ocamlopt.ctf", "--json"]);
    assert_eq!((ocaml["origin"].as_str(), ocaml["ocaml"]["promotions"].as_u64()), (Some("ocaml"), Some(257)));

    let hot = json(dir, &["hotspots", "known.ctf", "--json"]);
    let sites = hot["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 2);
    assert_eq!(sites[0]["frames"][0]["function"], "app::parse");
    assert_eq!(sites[0]["estimate"]["bytes"], 5600);
    assert_eq!(sites[0]["count"], 200, "two allocations of 100 objects each");

    let diff = json(dir, &["diff", "known.ctf", "known-new.ctf", "--json", "--fail-above", "0"]);
    assert_eq!(diff["sites_changed"], 3);
    assert_eq!(diff["changes"][0]["frames"][0], "app::run (src/app.rs:20)");
    // 4 samples against none: 2 deviations, beyond a lone 95 % margin (1.96) but within the
    // first Holm step's over 3 sites (2.39).
    assert_eq!(diff["changes"][0]["beyond_noise"], false);
    let (change, margin) = (&diff["changes"][0]["change"], &diff["changes"][0]["margin"]);
    assert!(change.as_f64().unwrap() < margin.as_f64().unwrap(), "{change} {margin}");
    assert_eq!(diff["total"]["change"], 2400);
    assert_eq!(diff["fail_above"]["exceeded"], false, "+2.3 KiB is within the noise of 11 and 14 samples");
}

/// Every count in the JSON outputs is a JSON integer, on real traces (OCaml's compiler and a
/// run of the sample app, traced here): samples, allocations and frees, and the estimates of
/// bytes and objects, rounded (`364999.999999999` is no count of bytes), or `null`.
#[test]
fn counts_are_integers_on_real_traces() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let app = dir.join("app.ctf");
    trace_run("sample-app", "1e-4", &app);
    let ocamlopt = data("ocamlopt.ctf");
    let lists = data("lists_and_sets-v1.ctf");
    let [app, ocamlopt, lists] = [&app, &ocamlopt, &lists].map(|p| p.to_str().unwrap().to_string());
    let mut documents = Vec::new();
    for t in [&app, &ocamlopt, &lists] {
        documents.push(json(dir, &["info", t, "--json"]));
        for by in ["allocated", "live-peak", "live-end", "temporary"] {
            documents.push(json(dir, &["hotspots", t, "--json", "--by", by, "--top", "1000"]));
        }
        documents.push(json(dir, &["hotspots", t, "--json", "--stacks", "--live-at", "peak", "--top", "1000"]));
    }
    for (base, new) in [(&ocamlopt, &lists), (&lists, &app)] {
        documents.push(json(dir, &["diff", base, new, "--json", "--top", "1000"]));
        documents.push(json(dir, &["diff", base, new, "--json", "--per-second", "--stacks"]));
    }
    let mut counts = 0;
    for doc in &documents {
        counts += assert_counts_are_integers(doc, "");
    }
    assert!(counts > 1000, "{counts} counts");
}

/// The fields of counts and estimates in `value` (at `at`) are integers or `null`; how many
/// there are.
fn assert_counts_are_integers(value: &Value, at: &str) -> usize {
    const COUNTS: [&str; 13] = [
        "bytes",
        "low",
        "high",
        "count",
        "samples",
        "value",
        "change",
        "margin",
        "allocations",
        "frees",
        "events",
        "sampled_words",
        "sites_total",
    ];
    match value {
        Value::Object(fields) => fields
            .iter()
            .map(|(key, v)| {
                let here = format!("{at}/{key}");
                if COUNTS.contains(&key.as_str()) && !v.is_object() {
                    assert!(v.is_u64() || v.is_i64() || v.is_null(), "{here}: {v} is no integer");
                    1
                } else {
                    assert_counts_are_integers(v, &here)
                }
            })
            .sum(),
        Value::Array(items) => {
            items.iter().enumerate().map(|(i, v)| assert_counts_are_integers(v, &format!("{at}/{i}"))).sum()
        }
        _ => 0,
    }
}
