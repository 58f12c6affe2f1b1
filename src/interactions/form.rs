//! MCP `requestedSchema` forms as AHP questions, and their answers back as a
//! `content` object that validates against the schema.
//!
//! The subset is MCP elicitation's: a flat object whose properties are
//! strings (with `format`, `minLength`, `maxLength`), numbers and integers
//! (with `minimum`, `maximum`), booleans, enums (`enum` + `enumNames`, or
//! `oneOf`/`anyOf` of `{const, title}` — an extra `{type: "string"}` branch
//! allows free-form input), and arrays of enums (`minItems`, `maxItems`).
//! Anything else is refused with the keyword named.

use std::collections::HashMap;

use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputBooleanQuestion, ChatInputMultiSelectQuestion,
    ChatInputNumberQuestion, ChatInputOption, ChatInputQuestion, ChatInputSingleSelectQuestion,
    ChatInputTextQuestion,
};
use serde_json::{Map, Value};

type Obj = Map<String, Value>;

fn keys_allowed(at: &str, obj: &Obj, allowed: &[&str]) -> Result<(), String> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!("unsupported keyword `{k}` in {at}")),
        None => Ok(()),
    }
}

const ANNOTATIONS: &[&str] = &["type", "title", "description", "default"];

fn str_field<'a>(obj: &'a Obj, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str)
}

fn int_field(at: &str, obj: &Obj, key: &str) -> Result<Option<i64>, String> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .filter(|n| *n >= 0)
            .map(Some)
            .ok_or_else(|| format!("`{key}` in {at} must be a non-negative integer")),
    }
}

/// Options of an enum-like schema: `enum` (+ `enumNames`), or `oneOf`/`anyOf`
/// of consts; the flag says an `anyOf` `{type: string}` branch allows
/// free-form input.
fn options_of(at: &str, obj: &Obj) -> Result<Option<(Vec<ChatInputOption>, bool)>, String> {
    if let Some(values) = obj.get("enum") {
        let values = values
            .as_array()
            .ok_or_else(|| format!("`enum` in {at} must be an array"))?;
        let names = obj.get("enumNames").and_then(Value::as_array);
        let mut out = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let id = v
                .as_str()
                .ok_or_else(|| format!("`enum` values in {at} must be strings"))?;
            let label = names
                .and_then(|n| n.get(i))
                .and_then(Value::as_str)
                .unwrap_or(id);
            out.push(ChatInputOption {
                id: id.into(),
                label: label.into(),
                description: None,
                recommended: None,
            });
        }
        return Ok(Some((out, false)));
    }
    let branches = match (obj.get("oneOf"), obj.get("anyOf")) {
        (Some(b), None) | (None, Some(b)) => b,
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => return Err(format!("{at} has both `oneOf` and `anyOf`")),
    };
    let branches = branches
        .as_array()
        .ok_or_else(|| format!("`oneOf`/`anyOf` in {at} must be an array"))?;
    let mut out = Vec::new();
    let mut freeform = false;
    for b in branches {
        let b = b
            .as_object()
            .ok_or_else(|| format!("a branch of {at} must be an object"))?;
        if let Some(c) = b.get("const") {
            keys_allowed(
                &format!("a branch of {at}"),
                b,
                &["const", "title", "description"],
            )?;
            let id = c
                .as_str()
                .ok_or_else(|| format!("`const` in {at} must be a string"))?;
            out.push(ChatInputOption {
                id: id.into(),
                label: str_field(b, "title").unwrap_or(id).into(),
                description: str_field(b, "description").map(Into::into),
                recommended: None,
            });
        } else if str_field(b, "type") == Some("string") && obj.contains_key("anyOf") {
            keys_allowed(
                &format!("the free-form branch of {at}"),
                b,
                &["type", "title", "description"],
            )?;
            freeform = true;
        } else {
            return Err(format!("a branch of {at} must be `{{const, title}}` (or `{{type: \"string\"}}` in `anyOf`)"));
        }
    }
    Ok(Some((out, freeform)))
}

fn mark_recommended(options: &mut [ChatInputOption], default: Option<&Value>) {
    let defaults: Vec<&str> = match default {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    for o in options.iter_mut() {
        if defaults.contains(&o.id.as_str()) {
            o.recommended = Some(true);
        }
    }
}

/// Turn a `requestedSchema` into questions (one per property, in order).
pub fn questions(schema: &Value) -> Result<Vec<ChatInputQuestion>, String> {
    let root = schema
        .as_object()
        .ok_or("the schema must be a JSON object")?;
    keys_allowed(
        "the schema",
        root,
        &[
            "type",
            "properties",
            "required",
            "title",
            "description",
            "$schema",
        ],
    )?;
    if str_field(root, "type") != Some("object") {
        return Err("the schema must have `type: \"object\"`".into());
    }
    let props = root
        .get("properties")
        .and_then(Value::as_object)
        .ok_or("the schema needs a `properties` object")?;
    let required: Vec<&str> = match root.get("required") {
        None => Vec::new(),
        Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
        Some(_) => return Err("`required` must be an array of property names".into()),
    };
    if let Some(missing) = required.iter().find(|r| !props.contains_key(**r)) {
        return Err(format!(
            "`required` names `{missing}`, which is not a property"
        ));
    }
    let mut out = Vec::new();
    for (name, p) in props {
        let at = format!("property `{name}`");
        let p = p
            .as_object()
            .ok_or_else(|| format!("{at} must be an object"))?;
        let title = str_field(p, "title").map(String::from);
        let message = str_field(p, "description")
            .or(str_field(p, "title"))
            .unwrap_or(name)
            .to_owned();
        let req = required.contains(&name.as_str()).then_some(true);
        // Every kind of question carries the property's name, title, message
        // and whether it is required.
        macro_rules! question {
            ($kind:ident { $($field:ident $(: $value:expr)?),* $(,)? }) => {
                $kind {
                    id: name.clone(),
                    title,
                    message,
                    required: req,
                    $($field $(: $value)?),*
                }
            };
        }
        let ty = str_field(p, "type");
        let q = match ty {
            Some("string") => {
                match options_of(&at, p)? {
                    Some((mut options, freeform)) => {
                        let mut allowed = ANNOTATIONS.to_vec();
                        allowed.extend(["enum", "enumNames", "oneOf", "anyOf"]);
                        keys_allowed(&at, p, &allowed)?;
                        mark_recommended(&mut options, p.get("default"));
                        ChatInputQuestion::SingleSelect(question!(ChatInputSingleSelectQuestion {
                            options,
                            allow_freeform_input: freeform.then_some(true),
                        }))
                    }
                    None => {
                        let mut allowed = ANNOTATIONS.to_vec();
                        allowed.extend(["format", "minLength", "maxLength"]);
                        keys_allowed(&at, p, &allowed)?;
                        if let Some(f) = str_field(p, "format") {
                            if !["email", "uri", "date", "date-time"].contains(&f) {
                                return Err(format!("unsupported `format` `{f}` in {at} (email, uri, date, date-time)"));
                            }
                        }
                        ChatInputQuestion::Text(question!(ChatInputTextQuestion {
                            format: str_field(p, "format").map(Into::into),
                            min: int_field(&at, p, "minLength")?,
                            max: int_field(&at, p, "maxLength")?,
                            default_value: str_field(p, "default").map(Into::into),
                        }))
                    }
                }
            }
            Some(kind @ ("number" | "integer")) => {
                let mut allowed = ANNOTATIONS.to_vec();
                allowed.extend(["minimum", "maximum"]);
                keys_allowed(&at, p, &allowed)?;
                let num = |k: &str| -> Result<Option<f64>, String> {
                    match p.get(k) {
                        None => Ok(None),
                        Some(v) => v
                            .as_f64()
                            .map(Some)
                            .ok_or_else(|| format!("`{k}` in {at} must be a number")),
                    }
                };
                let q = question!(ChatInputNumberQuestion {
                    min: num("minimum")?,
                    max: num("maximum")?,
                    default_value: num("default")?,
                });
                if kind == "integer" {
                    ChatInputQuestion::Integer(q)
                } else {
                    ChatInputQuestion::Number(q)
                }
            }
            Some("boolean") => {
                keys_allowed(&at, p, ANNOTATIONS)?;
                ChatInputQuestion::Boolean(question!(ChatInputBooleanQuestion {
                    default_value: p.get("default").and_then(Value::as_bool),
                }))
            }
            Some("array") => {
                let mut allowed = ANNOTATIONS.to_vec();
                allowed.extend(["items", "minItems", "maxItems", "uniqueItems"]);
                keys_allowed(&at, p, &allowed)?;
                let items = p
                    .get("items")
                    .and_then(Value::as_object)
                    .ok_or_else(|| format!("{at} is an array and needs `items` with an enum"))?;
                let item_at = format!("the items of {at}");
                keys_allowed(
                    &item_at,
                    items,
                    &[
                        "type",
                        "enum",
                        "enumNames",
                        "oneOf",
                        "anyOf",
                        "title",
                        "description",
                    ],
                )?;
                let (mut options, freeform) = options_of(&item_at, items)?.ok_or_else(|| {
                    format!("{item_at} must be an enum (`enum`, or `anyOf` of consts)")
                })?;
                mark_recommended(&mut options, p.get("default"));
                ChatInputQuestion::MultiSelect(question!(ChatInputMultiSelectQuestion {
                    options,
                    allow_freeform_input: freeform.then_some(true),
                    min: int_field(&at, p, "minItems")?,
                    max: int_field(&at, p, "maxItems")?,
                }))
            }
            Some(other) => return Err(format!("unsupported type `{other}` in {at}")),
            None if p.contains_key("enum")
                || p.contains_key("oneOf")
                || p.contains_key("anyOf") =>
            {
                return Err(format!("{at} needs `type: \"string\"` for its enum"));
            }
            None => return Err(format!("{at} has no `type`")),
        };
        out.push(q);
    }
    Ok(out)
}

/// The `content` object for accepted answers: one value per answered
/// property, typed as the schema says.
pub fn content(schema: &Value, answers: &HashMap<String, ChatInputAnswer>) -> Value {
    let props = schema.get("properties").and_then(Value::as_object);
    let mut out = Map::new();
    for (name, answer) in answers {
        let (ChatInputAnswer::Submitted(a) | ChatInputAnswer::Draft(a)) = answer else {
            continue;
        };
        let ty = props
            .and_then(|p| p.get(name))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str);
        let v = match (&a.value, ty) {
            (ChatInputAnswerValue::Text(t), _) => Value::from(t.value.clone()),
            (ChatInputAnswerValue::Number(n), Some("integer")) => Value::from(n.value as i64),
            (ChatInputAnswerValue::Number(n), _) => Value::from(n.value),
            (ChatInputAnswerValue::Boolean(b), _) => Value::from(b.value),
            (ChatInputAnswerValue::Selected(s), _) => {
                let free = s.freeform_values.as_ref().and_then(|f| f.first());
                let is_option = props
                    .and_then(|p| p.get(name))
                    .and_then(Value::as_object)
                    .and_then(|p| options_of("", p).ok().flatten())
                    .is_some_and(|(o, _)| o.iter().any(|o| o.id == s.value));
                match (is_option, free) {
                    (false, Some(text)) => Value::from(text.clone()),
                    _ => Value::from(s.value.clone()),
                }
            }
            (ChatInputAnswerValue::SelectedMany(s), _) => {
                let mut all: Vec<Value> = s.value.iter().cloned().map(Value::from).collect();
                all.extend(s.freeform_values.iter().flatten().cloned().map(Value::from));
                Value::Array(all)
            }
            (ChatInputAnswerValue::Unknown(_), _) => continue,
        };
        out.insert(name.clone(), v);
    }
    Value::Object(out)
}

/// Whether `n` lies outside the bounds the schema property `p` sets under
/// the keys `(min, max)` (either may be absent); a bound that `read` cannot
/// read as `T` is no bound.
fn outside<T: PartialOrd>(
    p: &Obj,
    (min, max): (&str, &str),
    n: T,
    read: fn(&Value) -> Option<T>,
) -> bool {
    let bound = |key: &str| p.get(key).and_then(read);
    bound(min).is_some_and(|m| n < m) || bound(max).is_some_and(|m| n > m)
}

/// Check `content` against the schema subset (what a provider will do).
pub fn validate(schema: &Value, content: &Value) -> Result<(), String> {
    let obj = content.as_object().ok_or("content must be an object")?;
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .ok_or("schema has no properties")?;
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !obj.contains_key(r) {
            return Err(format!("required `{r}` is missing"));
        }
    }
    for (k, v) in obj {
        let p = props
            .get(k)
            .and_then(Value::as_object)
            .ok_or_else(|| format!("`{k}` is not in the schema"))?;
        let options = options_of(k, p).ok().flatten();
        match str_field(p, "type") {
            Some("string") => {
                let s = v
                    .as_str()
                    .ok_or_else(|| format!("`{k}` must be a string"))?;
                if let Some((opts, freeform)) = &options {
                    if !freeform && !opts.iter().any(|o| o.id == s) {
                        return Err(format!("`{k}` = `{s}` is not one of its options"));
                    }
                }
                let len = s.chars().count() as i64;
                if outside(p, ("minLength", "maxLength"), len, Value::as_i64) {
                    return Err(format!("`{k}` has the wrong length"));
                }
            }
            Some(t @ ("number" | "integer")) => {
                let n = v
                    .as_f64()
                    .ok_or_else(|| format!("`{k}` must be a number"))?;
                if t == "integer" && !(v.is_i64() || v.is_u64()) {
                    return Err(format!("`{k}` must be an integer"));
                }
                if outside(p, ("minimum", "maximum"), n, Value::as_f64) {
                    return Err(format!("`{k}` is out of bounds"));
                }
            }
            Some("boolean") if v.is_boolean() => {}
            Some("boolean") => return Err(format!("`{k}` must be a boolean")),
            Some("array") => {
                let a = v
                    .as_array()
                    .ok_or_else(|| format!("`{k}` must be an array"))?;
                let items = p.get("items").and_then(Value::as_object);
                let item_opts = items.and_then(|i| options_of(k, i).ok().flatten());
                for item in a {
                    let s = item
                        .as_str()
                        .ok_or_else(|| format!("items of `{k}` must be strings"))?;
                    if let Some((opts, freeform)) = &item_opts {
                        if !freeform && !opts.iter().any(|o| o.id == s) {
                            return Err(format!("`{s}` is not an option of `{k}`"));
                        }
                    }
                }
                if outside(p, ("minItems", "maxItems"), a.len() as i64, Value::as_i64) {
                    return Err(format!("`{k}` has the wrong number of items"));
                }
            }
            _ => return Err(format!("`{k}` has an unsupported type")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn every_type() -> Value {
        json!({
            "type": "object",
            "properties": {
                "email": {"type": "string", "format": "email", "title": "Email", "minLength": 3, "maxLength": 60},
                "ratio": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
                "count": {"type": "integer", "minimum": 1, "maximum": 9},
                "agree": {"type": "boolean", "default": true},
                "size": {"type": "string", "enum": ["s", "m", "l"], "enumNames": ["Small", "Medium", "Large"], "default": "m"},
                "color": {"type": "string", "oneOf": [{"const": "red", "title": "Red"}, {"const": "blue", "title": "Blue"}]},
                "city": {"type": "string", "anyOf": [{"const": "paris", "title": "Paris"}, {"type": "string"}]},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 2}
            },
            "required": ["email", "count", "size"]
        })
    }

    #[test]
    fn every_supported_type_becomes_a_question() {
        let qs = questions(&every_type()).expect("supported");
        let kinds: Vec<&str> = qs.iter().map(crate::interactions::question_kind).collect();
        assert_eq!(
            kinds,
            [
                "text",
                "number",
                "integer",
                "boolean",
                "single-select",
                "single-select",
                "single-select",
                "multi-select"
            ]
        );
        let ChatInputQuestion::SingleSelect(size) = &qs[4] else {
            panic!()
        };
        assert_eq!(size.options[1].label, "Medium");
        assert_eq!(size.options[1].recommended, Some(true));
        assert_eq!(size.required, Some(true));
        let ChatInputQuestion::SingleSelect(city) = &qs[6] else {
            panic!()
        };
        assert_eq!(city.allow_freeform_input, Some(true));
        let ChatInputQuestion::MultiSelect(tags) = &qs[7] else {
            panic!()
        };
        assert_eq!((tags.min, tags.max), (Some(1), Some(2)));
    }

    #[test]
    fn unsupported_keywords_are_named() {
        let cases = [
            (
                json!({"type": "object", "properties": {"x": {"type": "string", "pattern": "^a"}}}),
                "`pattern`",
            ),
            (
                json!({"type": "object", "properties": {"x": {"type": "object"}}}),
                "unsupported type `object`",
            ),
            (
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
                "`additionalProperties`",
            ),
            (
                json!({"type": "object", "properties": {"x": {"type": "array", "items": {"type": "string"}}}}),
                "must be an enum",
            ),
            (
                json!({"type": "object", "properties": {"x": {"type": "string", "format": "ipv4"}}}),
                "`format` `ipv4`",
            ),
            (json!({"type": "array"}), "`type: \"object\"`"),
            (
                json!({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["y"]}),
                "`y`",
            ),
        ];
        for (schema, needle) in cases {
            let err = questions(&schema).expect_err(&schema.to_string());
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }

    #[test]
    fn accepted_answers_become_valid_content() {
        let answers: HashMap<String, ChatInputAnswer> = serde_json::from_value(json!({
            "email": {"state": "submitted", "value": {"kind": "text", "value": "a@b.c"}},
            "ratio": {"state": "submitted", "value": {"kind": "number", "value": 0.25}},
            "count": {"state": "submitted", "value": {"kind": "number", "value": 3}},
            "agree": {"state": "submitted", "value": {"kind": "boolean", "value": false}},
            "size": {"state": "submitted", "value": {"kind": "selected", "value": "l"}},
            "city": {"state": "submitted", "value": {"kind": "selected", "value": "", "freeformValues": ["Lyon"]}},
            "tags": {"state": "submitted", "value": {"kind": "selected-many", "value": ["a", "c"]}},
            "color": {"state": "skipped"}
        }))
        .expect("answers");
        let c = content(&every_type(), &answers);
        assert_eq!(c["count"], json!(3));
        assert!(c["count"].is_i64());
        assert_eq!(c["city"], json!("Lyon"));
        assert_eq!(c["tags"], json!(["a", "c"]));
        assert!(c.get("color").is_none());
        validate(&every_type(), &c).expect("content validates against the schema");
        assert!(validate(
            &every_type(),
            &json!({"email": "a@b.c", "count": 1.5, "size": "s"})
        )
        .is_err());
        assert!(
            validate(&every_type(), &json!({"email": "a@b.c", "count": 1})).is_err(),
            "required size missing"
        );
    }
}
