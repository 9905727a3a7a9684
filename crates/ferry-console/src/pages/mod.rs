//! The server-rendered pages: plain HTML from the same calls the JSON API makes, with small inline scripts for
//! what must run in the browser (the streamed filter scan, actions behind a confirmation, a redrive's progress).
//! No JavaScript build step. Every value shown is HTML-escaped; the caller's CSRF token is in a `<meta>` tag.

mod views;

use axum::Form;
use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::AppState;
use crate::auth::{SESSION_COOKIE, audit_record};

/// The page routes (behind the read guard).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(views::home))
        .route("/c/{cluster}", get(views::overview))
        .route("/c/{cluster}/topics", get(views::topics))
        .route("/c/{cluster}/topics/{topic}", get(views::topic))
        .route("/c/{cluster}/browse/{topic}/{partition}", get(views::browse))
        .route("/c/{cluster}/message/{topic}/{partition}/{offset}", get(views::message))
        .route("/c/{cluster}/groups", get(views::groups))
        .route("/c/{cluster}/groups/{group}", get(views::group))
        .route("/c/{cluster}/transactions", get(views::transactions))
}

/// HTML-escapes text.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a path segment.
pub fn seg(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}\
header{background:#17324d;color:#fff;padding:.6em 1em}header a{color:#cfe3ff;margin-right:1em}\
main{padding:1em}table{border-collapse:collapse;background:#fff;margin:.5em 0}td,th{border:1px solid #d5dbe3;\
padding:.25em .5em;text-align:left;font-size:.9em;vertical-align:top}th{background:#eef2f6}\
pre{white-space:pre-wrap;word-break:break-all;margin:0}.bad{color:#b3261e}.ok{color:#1e7b34}\
form{margin:.5em 0}input,select,textarea{font:inherit}.muted{color:#66707a}";

/// A page: nav for `cluster`, the caller's CSRF token, `body`.
pub fn layout(title: &str, cluster: Option<&str>, csrf: &str, body: &str) -> Html<String> {
    let nav = cluster.map_or(String::new(), |c| {
        let c = seg(c);
        format!(
            "<a href=\"/c/{c}\">Overview</a><a href=\"/c/{c}/topics\">Topics</a><a href=\"/c/{c}/groups\">Groups</a>\
             <a href=\"/c/{c}/transactions\">Transactions</a>"
        )
    });
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t} · Ferry console</title>\
         <meta name=\"csrf\" content=\"{csrf}\"><style>{STYLE}</style></head><body><header><b>Ferry console</b> · \
         {nav}<a href=\"/login\">Log in</a></header><main><h1>{t}</h1>{body}</main>\
         <script>{SCRIPT}</script></body></html>",
        t = esc(title),
        csrf = esc(csrf),
    ))
}

/// The helpers every page's scripts use: `act(url, body, question)` posts an action after a confirmation with the
/// CSRF token, and shows the answer in `#result`.
const SCRIPT: &str = r#"
function csrf(){return document.querySelector('meta[name=csrf]').content}
async function act(url, body, question){
  if(!confirm(question)) return null;
  body.confirm = true;
  const r = await fetch(url,{method:'POST',headers:{'content-type':'application/json','x-ferry-csrf':csrf()},body:JSON.stringify(body)});
  const j = await r.json();
  const out = document.getElementById('result');
  if(out){out.textContent = (r.ok?'done: ':'refused: ')+JSON.stringify(j,null,1);}
  return j;
}
"#;

/// The login form (also the answer to a page request without credentials).
pub fn login_page(message: Option<&str>, status: StatusCode) -> Response {
    let note = message.map_or(String::new(), |m| format!("<p class=\"bad\">{}</p>", esc(m)));
    let body = format!(
        "{note}<form method=\"post\" action=\"/login\"><label>Console token <input type=\"password\" name=\"token\" \
         autocomplete=\"current-password\"></label> <button>Log in</button></form><p class=\"muted\">The token is sent \
         in the form body only; the browser keeps a session cookie.</p>"
    );
    (status, layout("Log in", None, "", &body)).into_response()
}

/// `GET /login`.
pub async fn login() -> Response {
    login_page(None, StatusCode::OK)
}

/// The login form's body.
#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

/// `POST /login`: a session cookie for a known token (audited).
pub async fn login_post(
    State(s): State<AppState>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    _headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let (who, response) = match s.auth.login(&f.token) {
        Some((id, p)) => {
            let cookie = format!("{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/");
            let mut r = Redirect::to("/").into_response();
            if let Ok(v) = cookie.parse() {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            (p.name, r)
        }
        None => ("unknown".to_owned(), login_page(Some("unknown token"), StatusCode::UNAUTHORIZED)),
    };
    s.audit.record(&audit_record("login", &who, "POST", "/login", &peer.to_string(), &response)).await;
    response
}
