//! An Execution's output as its kernel produces it, from the operator's aggregated API
//! (`executions/{name}/log?follow=true`): stdout to stdout and stderr to stderr, in order. Where
//! the cluster has no such API (an older operator, the API turned off), nothing is shown live
//! and the result is printed from the status as before.

use futures::{AsyncBufReadExt as _, TryStreamExt as _};
use kube::Client;

use crate::{
    briq::Stream,
    subresources::{GROUP, Piece, VERSION},
};

/// How much of the logs the live output showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Nothing: the status's logs are to be printed.
    Nothing,
    /// Some, then the stream broke: the status's logs are printed after a note.
    Part,
    /// All of them, the status's tail after a cut included.
    All,
}

/// Prints `name`'s output as it comes, until it ends.
pub async fn follow(client: &Client, namespace: &str, name: &str) -> Shown {
    let path = format!(
        "/apis/{GROUP}/{VERSION}/namespaces/{namespace}/executions/{name}/log?follow=true&format=json"
    );
    let Ok(request) = http::Request::get(path).body(Vec::new()) else {
        return Shown::Nothing;
    };
    let Ok(stream) = client.request_stream(request).await else {
        return Shown::Nothing;
    };
    let mut lines = stream.lines();
    let mut shown = Shown::Nothing;
    loop {
        let Ok(Some(line)) = lines.try_next().await else {
            return if shown == Shown::Nothing {
                Shown::Nothing
            } else {
                Shown::Part
            };
        };
        match serde_json::from_str::<Piece>(&line) {
            Ok(Piece::Text { stream, text }) => {
                match stream {
                    Stream::Stdout => super::output::emit(&text, ""),
                    Stream::Stderr => super::output::emit("", &text),
                }
                shown = Shown::Part;
            }
            Ok(Piece::Cut { cut }) => super::output::emit(
                "",
                &format!("note: live output stops after {cut} characters; its end follows\n"),
            ),
            Ok(Piece::End { .. }) => return Shown::All,
            Err(_) => return Shown::Part,
        }
    }
}
