//! A checker for the subset of OpenAPI 3.0 schema that docs/openapi.yaml uses: `$ref`, `type`, `nullable`,
//! `enum`, `required`, `properties`, `additionalProperties` (bool or schema), `items` and `minimum`. Written here
//! because the JSON-schema crates pull in HTTP stacks of their own, and OpenAPI 3.0's `nullable` is not JSON
//! Schema anyway.

use std::path::PathBuf;

use serde_json::Value;

/// The parsed document.
pub struct OpenApi {
    doc: Value,
}

impl OpenApi {
    /// Loads docs/openapi.yaml from the workspace root.
    pub fn load() -> OpenApi {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.yaml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let doc: Value =
            serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()));
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."), "not an OpenAPI 3 document");
        OpenApi { doc }
    }

    /// The documented paths and their methods, e.g. `("post", "/api/v1/egress/switch")`.
    pub fn operations(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (path, item) in self.doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                out.push((method.clone(), path.clone()));
            }
        }
        out.sort();
        out
    }

    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        let mut v = v;
        while let Some(r) = v.get("$ref").and_then(Value::as_str) {
            let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("only local $ref is supported: {r}"));
            v = self.doc.pointer(pointer).unwrap_or_else(|| panic!("dangling $ref {r}"));
        }
        v
    }

    /// The response object documented for `method path status` (falling back to `default`).
    fn response(&self, method: &str, path: &str, status: u16) -> &Value {
        let op = &self.doc["paths"][path][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {path} is not documented in docs/openapi.yaml");
        let responses = &op["responses"];
        let r = responses
            .get(status.to_string())
            .or_else(|| responses.get("default"))
            .unwrap_or_else(|| panic!("{method} {path} documents neither status {status} nor a default response"));
        self.resolve(r)
    }

    /// Asserts that `body` (served with `status` and `content_type`) is what the document says for the
    /// operation.
    pub fn check(&self, method: &str, path: &str, status: u16, content_type: &str, body: &Value) {
        let response = self.response(method, path, status);
        let media = content_type.split(';').next().unwrap_or("").trim();
        let schema = response["content"]
            .get(media)
            .map(|c| &c["schema"])
            .unwrap_or_else(|| panic!("{method} {path} {status}: content type {media:?} is not documented"));
        if let Err(e) = self.validate(schema, body, "$") {
            panic!("{method} {path} {status}: the body does not match docs/openapi.yaml: {e}\nbody: {body:#}");
        }
    }

    /// Asserts that `content_type` is documented for a non-JSON answer.
    pub fn check_media(&self, method: &str, path: &str, status: u16, content_type: &str) {
        let media = content_type.split(';').next().unwrap_or("").trim();
        let response = self.response(method, path, status);
        assert!(
            response["content"].get(media).is_some(),
            "{method} {path} {status}: content type {media:?} is not documented"
        );
    }

    /// Validates `value` against a named component schema.
    pub fn check_component(&self, name: &str, value: &Value) {
        let schema = &self.doc["components"]["schemas"][name];
        assert!(schema.is_object(), "no component schema {name}");
        if let Err(e) = self.validate(schema, value, "$") {
            panic!("does not match components.schemas.{name}: {e}\nvalue: {value:#}");
        }
    }

    fn validate(&self, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
        let s = self.resolve(schema);
        // `nullable` beside a `$ref` makes the referenced schema nullable there.
        let nullable = |x: &Value| x.get("nullable").and_then(Value::as_bool) == Some(true);
        if v.is_null() && (nullable(schema) || nullable(s)) {
            return Ok(());
        }
        if let Some(allowed) = s.get("enum").and_then(Value::as_array)
            && !allowed.contains(v)
        {
            return Err(format!("{at}: {v} is not one of {allowed:?}"));
        }
        if let Some(min) = s.get("minimum").and_then(Value::as_f64)
            && v.as_f64().is_some_and(|n| n < min)
        {
            return Err(format!("{at}: {v} is below the minimum {min}"));
        }
        let Some(ty) = s.get("type").and_then(Value::as_str) else { return Ok(()) };
        let ok = match ty {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            other => return Err(format!("{at}: the checker does not know type {other:?}")),
        };
        if !ok {
            return Err(format!("{at}: expected {ty}, got {v}"));
        }
        if let Some(items) = v.as_array() {
            let item_schema = s.get("items").ok_or_else(|| format!("{at}: array schema without items"))?;
            for (i, item) in items.iter().enumerate() {
                self.validate(item_schema, item, &format!("{at}[{i}]"))?;
            }
        }
        if let Some(obj) = v.as_object() {
            let props = s.get("properties").and_then(Value::as_object);
            for req in s.get("required").and_then(Value::as_array).into_iter().flatten() {
                let key = req.as_str().unwrap_or_default();
                if !obj.contains_key(key) {
                    return Err(format!("{at}: required field {key:?} is missing"));
                }
            }
            for (key, value) in obj {
                let path = format!("{at}.{key}");
                match (props.and_then(|p| p.get(key)), s.get("additionalProperties")) {
                    (Some(p), _) => self.validate(p, value, &path)?,
                    (None, Some(Value::Bool(false))) => {
                        return Err(format!("{path}: field not documented (additionalProperties: false)"));
                    }
                    (None, Some(extra)) if extra.is_object() => self.validate(extra, value, &path)?,
                    (None, _) => {}
                }
            }
        }
        Ok(())
    }
}
