//! A validator for the part of JSON Schema that `docs/json/*.schema.json` use: `type`,
//! `properties`, `required`, `additionalProperties: false`, `items`, `enum`, `const`,
//! `minimum` and `oneOf`. (The `jsonschema` crate would pull in some forty crates and a
//! regex engine for these nine keywords.) Unknown keywords fail, so a schema cannot use
//! more than is checked.

use serde_json::Value;

/// The schema `docs/json/<name>.schema.json`.
pub fn load(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("docs/json/{name}.schema.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The errors of `value` against `schema`, each with its JSON pointer.
pub fn errors(schema: &Value, value: &Value) -> Vec<String> {
    errors_at(schema, value, "")
}

fn type_matches(name: &str, value: &Value) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        // An integer as written: `365000.0` or `364999.999999999` is a float, however close.
        "integer" => value.is_u64() || value.is_i64(),
        other => panic!("unknown type {other}"),
    }
}

fn check(schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let schema = schema.as_object().expect("a schema is an object");
    for (keyword, arg) in schema {
        match keyword.as_str() {
            "$schema" | "title" | "description" => {}
            "type" => {
                let names: Vec<&str> = match arg {
                    Value::String(s) => vec![s],
                    Value::Array(a) => a.iter().map(|t| t.as_str().unwrap()).collect(),
                    _ => panic!("bad type"),
                };
                if !names.iter().any(|n| type_matches(n, value)) {
                    errors.push(format!("{at}: {value} is not of type {names:?}"));
                }
            }
            "properties" => {
                if let Some(object) = value.as_object() {
                    for (key, sub) in arg.as_object().unwrap() {
                        if let Some(v) = object.get(key) {
                            check(sub, v, &format!("{at}/{key}"), errors);
                        }
                    }
                }
            }
            "required" => {
                if let Some(object) = value.as_object() {
                    for key in arg.as_array().unwrap() {
                        if !object.contains_key(key.as_str().unwrap()) {
                            errors.push(format!("{at}: missing {key}"));
                        }
                    }
                }
            }
            "additionalProperties" => {
                assert_eq!(arg, &Value::Bool(false), "only additionalProperties: false");
                let known = schema["properties"].as_object().unwrap();
                for key in value.as_object().into_iter().flat_map(|o| o.keys()) {
                    if !known.contains_key(key) {
                        errors.push(format!("{at}: unexpected {key}"));
                    }
                }
            }
            "items" => {
                for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                    check(arg, item, &format!("{at}/{i}"), errors);
                }
            }
            "enum" => {
                if !arg.as_array().unwrap().contains(value) {
                    errors.push(format!("{at}: {value} not in {arg}"));
                }
            }
            "const" => {
                if arg != value {
                    errors.push(format!("{at}: {value} is not {arg}"));
                }
            }
            "minimum" => {
                if value.as_f64().is_some_and(|v| v < arg.as_f64().unwrap()) {
                    errors.push(format!("{at}: {value} below {arg}"));
                }
            }
            "oneOf" => {
                let matching = arg.as_array().unwrap().iter().filter(|s| errors_at(s, value, at).is_empty()).count();
                if matching != 1 {
                    errors.push(format!("{at}: {value} matches {matching} of oneOf"));
                }
            }
            other => panic!("the validator does not know the keyword {other}"),
        }
    }
}

fn errors_at(schema: &Value, value: &Value, at: &str) -> Vec<String> {
    let mut errors = Vec::new();
    check(schema, value, at, &mut errors);
    errors
}
