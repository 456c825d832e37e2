//! The live view at `/ui/`: a page and its script and style, compiled into the binary.
//!
//! Only these static files are served without authentication: the page reads the cluster
//! through the ordinary API (LIST then WATCH) with the bearer token the user gives it, so
//! authentication and authorization apply to every object it shows (docs/ui.md).

use axum::body::Body;
use axum::response::Response;
use http::{Method, StatusCode};

/// What the page may load and where it may connect: its own origin only, no inline script or
/// style, no frames, no forms posting elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The files under `/ui/`: path, content type, body.
const FILES: &[(&str, &str, &str)] = &[
    (
        "/ui/",
        "text/html; charset=utf-8",
        include_str!("ui/index.html"),
    ),
    (
        "/ui/app.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/app.js"),
    ),
    (
        "/ui/app.css",
        "text/css; charset=utf-8",
        include_str!("ui/app.css"),
    ),
];

/// Whether `path` belongs to the live view (answered by [`serve`] before authentication).
pub fn is_ui_path(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// The answer for a request under `/ui`: the file, a redirect from `/ui` to `/ui/`, 404 for
/// an unknown file, 405 for anything but GET and HEAD.
pub fn serve(method: &Method, path: &str) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return Response::builder()
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .header(http::header::ALLOW, "GET, HEAD")
            .body(Body::empty())
            .expect("valid response");
    }
    if path == "/ui" {
        return Response::builder()
            .status(StatusCode::MOVED_PERMANENTLY)
            .header(http::header::LOCATION, "/ui/")
            .body(Body::empty())
            .expect("valid response");
    }
    let path = if path == "/ui/index.html" {
        "/ui/"
    } else {
        path
    };
    let Some((_, content_type, text)) = FILES.iter().find(|(p, _, _)| *p == path) else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Body::from("404 page not found\n"))
            .expect("valid response");
    };
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::from(*text)
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, *content_type)
        .header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        .header("X-Content-Type-Options", "nosniff")
        .header("Referrer-Policy", "no-referrer")
        // The files change with the binary: revalidate rather than keep an old script.
        .header(http::header::CACHE_CONTROL, "no-cache")
        .body(body)
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_the_files_with_a_policy_and_nothing_else() {
        let page = serve(&Method::GET, "/ui/");
        assert_eq!(page.status(), StatusCode::OK);
        let csp = page.headers()["Content-Security-Policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
        assert_eq!(serve(&Method::GET, "/ui/app.js").status(), StatusCode::OK);
        assert_eq!(
            serve(&Method::GET, "/ui").status(),
            StatusCode::MOVED_PERMANENTLY
        );
        assert_eq!(
            serve(&Method::GET, "/ui/secret").status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            serve(&Method::POST, "/ui/").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert!(is_ui_path("/ui") && is_ui_path("/ui/app.js") && !is_ui_path("/uix"));
    }

    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let page = include_str!("ui/index.html");
        assert!(!page.contains("<script>") && !page.contains("style="));
        assert!(page.contains("<script type=\"module\" src=\"app.js\">"));
    }
}
