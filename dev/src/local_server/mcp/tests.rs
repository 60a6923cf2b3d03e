//! The MCP endpoint over real HTTP, on a server spawned on loopback.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use serde_json::{Value, json};

use crate::local_server::{
    self, Config, DeclaredChange, Fault, FaultRule, LocalServer, Operation, Simulation,
};
use briq_operator::briq::ApiKey;
use briq_operator::briq::api::{
    self, ErrorCode, ExecArgs, ExecRequest, LOCAL_ROOT_ENV, ToolErrorBody, tools,
};

const KEY: &str = "mcp-test-key";

struct Client {
    server: LocalServer,
    http: reqwest::Client,
    session: Option<String>,
}

async fn client() -> Client {
    client_with(|_| {}).await
}

async fn client_with(adjust: impl FnOnce(&mut Config)) -> Client {
    let mut config = Config::new(ApiKey::new(KEY).unwrap());
    adjust(&mut config);
    let server = local_server::spawn(config).await.unwrap();
    let mut client = Client {
        server,
        http: reqwest::Client::new(),
        session: None,
    };
    client.initialize().await;
    client
}

impl Client {
    async fn post(&self, message: &Value) -> reqwest::Response {
        let mut request = self
            .http
            .post(self.server.url())
            .bearer_auth(KEY)
            .header("accept", "application/json, text/event-stream")
            .json(message);
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        request.send().await.unwrap()
    }

    async fn initialize(&mut self) {
        let answer = self
            .post(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}}}))
            .await;
        assert_eq!(answer.status(), StatusCode::OK);
        self.session = answer
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(self.post(&initialized).await.status(), StatusCode::ACCEPTED);
    }

    /// The JSON-RPC response to `method` (HTTP 200 expected).
    async fn request(&self, method: &str, params: Value) -> Value {
        let answer = self
            .post(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
            .await;
        assert_eq!(answer.status(), StatusCode::OK);
        let message: Value = answer.json().await.unwrap();
        assert_eq!(message["id"], json!(7), "{message}");
        message
    }

    /// The result of calling `tool`.
    async fn call(&self, tool: &str, arguments: Value) -> Value {
        let message = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        message
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{message}"))
    }

    /// The structured answer of a successful call.
    async fn answer(&self, tool: &str, arguments: Value) -> Value {
        let result = self.call(tool, arguments).await;
        assert_eq!(result["isError"], json!(false), "{result}");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(text).unwrap(),
            result["structuredContent"]
        );
        result["structuredContent"].clone()
    }

    /// The error body of a call answered with a tool error.
    async fn tool_error(&self, tool: &str, arguments: Value) -> ToolErrorBody {
        let result = self.call(tool, arguments).await;
        assert_eq!(result["isError"], json!(true), "{result}");
        assert!(result.get("structuredContent").is_none(), "{result}");
        serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap()
    }

    /// The JSON-RPC error of a call refused before it ran.
    async fn refusal(&self, tool: &str, arguments: Value) -> Value {
        let message = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        assert!(message.get("result").is_none(), "{message}");
        message["error"].clone()
    }

    async fn run(&self, name: &str) -> String {
        let sandbox = self
            .answer(
                tools::RUN,
                json!({"image": "python", "name": name, "sleep": "30m", "wait": true}),
            )
            .await;
        assert_eq!(sandbox["state"], json!("running"), "{sandbox}");
        sandbox["id"].as_str().unwrap().to_owned()
    }
}

#[tokio::test]
async fn initialize_opens_a_session_that_every_later_message_needs() {
    let mut c = client().await;
    let session = c.session.clone().unwrap();
    let token = session.strip_prefix("mcp_").unwrap();
    assert_eq!(token.len(), 24, "{session}");
    assert!(
        token.bytes().all(|b| b.is_ascii_alphanumeric()),
        "{session}"
    );
    // The version asked for when spoken, else the default.
    for (asked, answered) in [
        (json!("2025-03-26"), "2025-03-26"),
        (json!("2025-11-25"), "2025-11-25"),
        (json!("2024-11-05"), "2025-06-18"),
        (Value::Null, "2025-06-18"),
    ] {
        let message = c
            .request(
                "initialize",
                json!({"protocolVersion": asked, "capabilities": {}}),
            )
            .await;
        let result = &message["result"];
        assert_eq!(result["protocolVersion"], json!(answered), "{message}");
        assert_eq!(
            result["capabilities"],
            json!({"tools": {"listChanged": false}})
        );
        assert_eq!(result["serverInfo"]["name"], json!("briq-local"));
        assert_eq!(
            result["serverInfo"]["version"],
            json!(env!("CARGO_PKG_VERSION"))
        );
    }
    assert_eq!(c.request("ping", json!({})).await["result"], json!({}));
    // Without a session: 400; with one the server does not know: 404, which means expired.
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    c.session = None;
    let missing = c.post(&list).await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], json!(-32600), "{body}");
    assert_eq!(
        body["error"]["message"],
        json!("missing Mcp-Session-Id: initialize first")
    );
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(
        c.post(&notification).await.status(),
        StatusCode::BAD_REQUEST
    );
    c.session = Some("mcp_unknown".to_owned());
    assert_eq!(c.post(&list).await.status(), StatusCode::NOT_FOUND);
    // A session ends with DELETE, then it is unknown.
    c.session = Some(session.clone());
    assert_eq!(c.post(&list).await.status(), StatusCode::OK);
    let url = c.server.url();
    let end = c.http.delete(url.clone()).bearer_auth(KEY);
    let ended = end.header("mcp-session-id", &session).send().await.unwrap();
    assert_eq!(ended.status(), StatusCode::NO_CONTENT);
    assert_eq!(c.post(&list).await.status(), StatusCode::NOT_FOUND);
    // No stream of the server's own; a wrong key is refused in JSON-RPC's words.
    let get = c
        .http
        .get(url.clone())
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
    let wrong = c
        .http
        .post(url)
        .bearer_auth("wrong")
        .json(&list)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        wrong.json::<Value>().await.unwrap(),
        json!({"jsonrpc": "2.0", "id": null,
            "error": {"code": -32001, "message": "missing or wrong API key"}})
    );
    c.server.shutdown().await;
}

#[tokio::test]
async fn tools_list_declares_the_implemented_tools_as_published() {
    let c = client().await;
    let tools: Vec<Value> =
        serde_json::from_value(c.request("tools/list", json!({})).await["result"]["tools"].clone())
            .unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            tools::RUN,
            tools::LIST,
            tools::STATUS,
            tools::EXEC,
            tools::EXEC_RESULT,
            tools::EXEC_STOP,
            tools::FILES_PUT,
            tools::FILES_GET,
            tools::STOP,
            tools::START,
            tools::DESTROY,
            tools::FORK
        ]
    );
    for tool in &tools {
        assert!(
            tool["title"].is_string() && tool["description"].is_string(),
            "{tool}"
        );
        let schema = &tool["inputSchema"];
        assert_eq!(schema["type"], json!("object"), "{tool}");
        assert_eq!(schema["additionalProperties"], json!(false), "{tool}");
        assert!(tool["annotations"].is_object(), "{tool}");
    }
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap().clone();
    let exec = tool(tools::EXEC);
    assert_eq!(exec["inputSchema"]["required"], json!(["cmd", "briq"]));
    let properties: Vec<&String> = exec["inputSchema"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(properties.len(), 6, "{properties:?}");
    for name in ["briq", "cmd", "env", "stdin", "async", "clearEnv"] {
        assert!(
            exec["inputSchema"]["properties"].get(name).is_some(),
            "{name}"
        );
    }
    assert_eq!(
        exec["inputSchema"]["properties"]["cmd"]["type"],
        json!("array")
    );
    assert_eq!(exec["annotations"], json!({"destructiveHint": true}));
    let list = tool(tools::LIST);
    assert_eq!(list["inputSchema"]["required"], json!([]));
    assert_eq!(
        list["annotations"],
        json!({"readOnlyHint": true, "idempotentHint": true, "destructiveHint": false,
            "openWorldHint": false})
    );
    let destroy = tool(tools::DESTROY);
    assert_eq!(destroy["inputSchema"]["required"], json!([]));
    let run = tool(tools::RUN);
    assert_eq!(run["inputSchema"]["required"], json!(["image"]));
    assert_eq!(
        run["inputSchema"]["properties"]["wait"],
        json!({"type": "boolean", "default": true,
            "description": run["inputSchema"]["properties"]["wait"]["description"]})
    );
    assert_eq!(run["annotations"], json!({}));
    c.server.shutdown().await;
}

#[tokio::test]
async fn the_admin_api_changes_what_is_declared_and_checked() {
    let c = client().await;
    let admin = c.server.admin();
    let exec = || async {
        let tools = c.request("tools/list", json!({})).await["result"]["tools"].clone();
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == tools::EXEC)
            .cloned()
    };
    admin
        .declare(&DeclaredChange::DropParameter {
            tool: tools::EXEC.into(),
            parameter: "stdin".into(),
        })
        .await
        .unwrap();
    admin
        .declare(&DeclaredChange::RequireParameter {
            tool: tools::EXEC.into(),
            parameter: "cwd".into(),
        })
        .await
        .unwrap();
    let declared = exec().await.unwrap();
    assert!(declared["inputSchema"]["properties"].get("stdin").is_none());
    assert_eq!(
        declared["inputSchema"]["required"],
        json!(["cmd", "briq", "cwd"])
    );
    let refused = c
        .refusal(tools::EXEC, json!({"briq": "bq_x", "cmd": ["true"]}))
        .await;
    assert!(
        refused["message"].as_str().unwrap().contains("`cwd`"),
        "{refused}"
    );
    // A change naming what is not declared is refused.
    assert!(
        admin
            .declare(&DeclaredChange::DropTool {
                tool: "briq_nothing".into(),
            })
            .await
            .is_err()
    );
    admin
        .declare(&DeclaredChange::DropTool {
            tool: tools::EXEC.into(),
        })
        .await
        .unwrap();
    assert!(exec().await.is_none());
    let unknown = c.refusal(tools::EXEC, json!({})).await;
    assert_eq!(
        unknown,
        json!({"code": -32602, "message": "unknown tool briq_exec"})
    );
    admin.restore_declared().await.unwrap();
    let restored = exec().await.unwrap();
    assert_eq!(restored["inputSchema"]["required"], json!(["cmd", "briq"]));
    c.server.shutdown().await;
}

#[tokio::test]
async fn tool_errors_carry_the_error_body() {
    let c = client().await;
    let error = c
        .tool_error(tools::STATUS, json!({"briq": "bq_nothing"}))
        .await;
    assert_eq!(error.error.code, ErrorCode::NotFound);
    assert!(error.error.message.contains("bq_nothing"), "{error:?}");
    let id = c.run("errors").await;
    let stopped = c.answer(tools::STOP, json!({"briq": id})).await;
    assert_eq!(stopped["state"], json!("stopped"));
    let exec = json!({"briq": id, "cmd": ["true"]});
    let error = c.tool_error(tools::EXEC, exec.clone()).await;
    assert_eq!(error.error.code, ErrorCode::InvalidRequest);
    assert!(error.error.message.contains("stopped"), "{error:?}");
    c.answer(tools::START, json!({"briq": id})).await;
    assert_eq!(c.answer(tools::EXEC, exec).await["exitCode"], json!(0));
    // Published but not implemented here.
    for (tool, arguments, parameter) in [
        (
            tools::EXEC,
            json!({"briq": id, "cmd": ["true"], "clearEnv": true}),
            "clearEnv",
        ),
        (tools::LIST, json!({"stack": "shop"}), "stack"),
        (tools::DESTROY, json!({"stack": "shop"}), "stack"),
    ] {
        let error = c.tool_error(tool, arguments).await;
        assert_eq!(error.error.code, ErrorCode::InvalidRequest);
        assert!(
            error.error.message.contains(parameter)
                && error
                    .error
                    .message
                    .contains("not supported by the local server"),
            "{error:?}"
        );
    }
    let destroyed = c.answer(tools::DESTROY, json!({"briq": id})).await;
    assert_eq!(destroyed, json!({"briq": id, "state": "destroyed"}));
    let again = c.tool_error(tools::DESTROY, json!({"briq": id})).await;
    assert_eq!(again.error.code, ErrorCode::NotFound);
    c.server.shutdown().await;
}

#[tokio::test]
async fn arguments_the_tool_does_not_declare_are_refused_before_it_runs() {
    let c = client().await;
    let before = c
        .server
        .admin()
        .stats()
        .await
        .unwrap()
        .calls(Operation::Create);
    for (tool, arguments, named) in [
        (
            tools::RUN,
            json!({"image": "python", "colour": "red"}),
            "`colour`",
        ),
        (tools::RUN, json!({"name": "n"}), "`image`"),
        (tools::LIST, json!({"all": "yes"}), "`all`"),
        (tools::EXEC, json!({"briq": "bq_x", "cmd": "true"}), "`cmd`"),
        (tools::DESTROY, json!({}), "`briq`"),
    ] {
        let error = c.refusal(tool, arguments.clone()).await;
        assert_eq!(error["code"], json!(-32602), "{tool} {arguments}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(named), "{tool} {arguments}: {message}");
    }
    let unknown = c.refusal("briq_preview", json!({})).await;
    assert_eq!(unknown["message"], json!("unknown tool briq_preview"));
    // Refused calls are calls all the same.
    let stats = c.server.admin().stats().await.unwrap();
    assert_eq!(stats.calls(Operation::Create) - before, 2);
    assert!(stats.sandboxes.is_empty(), "{stats:?}");
    c.server.shutdown().await;
}

#[tokio::test]
async fn a_sandbox_lives_through_the_tools() {
    let c = client().await;
    // Only the image is required.
    let defaulted = c
        .answer(tools::RUN, json!({"image": "python:3.12-slim"}))
        .await;
    assert_eq!(
        (&defaulted["name"], &defaulted["sleep"], &defaulted["state"]),
        (&json!("python"), &json!("1h"), &json!("running"))
    );
    assert!(defaulted["createdAt"].is_string(), "{defaulted}");
    let answered_at_once = c
        .answer(
            tools::RUN,
            json!({"image": "python", "name": "later", "sleep": "30m", "wait": false}),
        )
        .await;
    assert_eq!(answered_at_once["state"], json!("creating"));
    let id = answered_at_once["id"].as_str().unwrap().to_owned();
    assert_eq!(
        c.answer(tools::STATUS, json!({"briq": id})).await["state"],
        json!("running")
    );
    // The client's exec: the prelude runs the command in its directory, inside the sandbox.
    let request = ExecRequest {
        argv: vec![
            "sh".into(),
            "-c".into(),
            "pwd; echo \"$FROM_CALL\"; cat; exit 3".into(),
        ],
        cwd: Some("/work/here".into()),
        env: BTreeMap::from([("FROM_CALL".into(), "call-value".into())]),
        timeout: Duration::from_secs(10),
        stdin: Some("from-stdin".into()),
    };
    let args = serde_json::to_value(ExecArgs::from_request(&id, &request)).unwrap();
    let output = c.answer(tools::EXEC, args).await;
    assert_eq!(output["exitCode"], json!(3), "{output}");
    let lines: Vec<&str> = output["stdout"].as_str().unwrap().lines().collect();
    assert!(
        lines[0].ends_with(&format!("/{id}/fs/work/here")),
        "{lines:?}"
    );
    assert_eq!(lines[1..], ["call-value", "from-stdin"]);
    let root = c
        .answer(
            tools::EXEC,
            json!({"briq": id, "cmd": ["sh", "-c", format!("pwd; echo ${LOCAL_ROOT_ENV}")]}),
        )
        .await;
    let lines: Vec<&str> = root["stdout"].as_str().unwrap().lines().collect();
    assert!(lines[0].ends_with(&format!("/{id}/fs")), "{lines:?}");
    assert_eq!(lines[0], lines[1]);
    // A file written by the tool is read by the command, and back.
    let put = c
        .answer(
            tools::FILES_PUT,
            serde_json::to_value(api::FilesPutArgs::new(&id, "/work/here/a.txt", b"hello"))
                .unwrap(),
        )
        .await;
    assert_eq!(put["size"], json!(5));
    assert_eq!(
        put["sha256"],
        json!("2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824")
    );
    let get = c
        .answer(
            tools::FILES_GET,
            json!({"briq": id, "path": "/work/here/a.txt"}),
        )
        .await;
    assert_eq!(
        get,
        json!({"path": "/work/here/a.txt", "contentBase64": BASE64.encode("hello")})
    );
    let cut = c
        .tool_error(
            tools::FILES_PUT,
            json!({"briq": id, "path": "/b", "contentBase64": "aGVsbG"}),
        )
        .await;
    assert_eq!(cut.error.code, ErrorCode::InvalidRequest);
    // Listing: destroyed briqs only with `all`.
    c.answer(tools::DESTROY, json!({"briq": id})).await;
    let listed = |answer: Value| -> Vec<(String, String)> {
        answer["briqs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["name"].as_str().unwrap().into(),
                    b["state"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    assert_eq!(
        listed(c.answer(tools::LIST, json!({})).await),
        [("python".to_owned(), "running".to_owned())]
    );
    assert_eq!(
        listed(c.answer(tools::LIST, json!({"all": true})).await),
        [
            ("python".to_owned(), "running".to_owned()),
            ("later".to_owned(), "destroyed".to_owned())
        ]
    );
    let status = c.tool_error(tools::STATUS, json!({"briq": id})).await;
    assert_eq!(status.error.code, ErrorCode::NotFound);
    c.server.shutdown().await;
}

#[tokio::test]
async fn an_image_read_is_an_image_item() {
    let c = client().await;
    let id = c.run("pictures").await;
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    let put = api::FilesPutArgs::new(&id, "/shot.png", png);
    c.answer(tools::FILES_PUT, serde_json::to_value(put).unwrap())
        .await;
    let result = c
        .call(tools::FILES_GET, json!({"briq": id, "path": "/shot.png"}))
        .await;
    assert_eq!(
        result,
        json!({"content": [{"type": "image", "data": BASE64.encode(png), "mimeType": "image/png"}],
            "isError": false})
    );
    c.server.shutdown().await;
}

/// The body of an event stream, checked to be one.
async fn event_stream(answer: reqwest::Response) -> String {
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(
        answer.headers()[CONTENT_TYPE].to_str().unwrap(),
        "text/event-stream"
    );
    answer.text().await.unwrap()
}

#[tokio::test]
async fn answers_travel_as_event_streams_when_asked() {
    let c = client_with(|config| config.sse_answers = true).await;
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": tools::LIST, "arguments": {}}});
    let body = event_stream(c.post(&call).await).await;
    let data = body
        .strip_prefix(": briq-local\n\nevent: message\ndata: ")
        .and_then(|rest| rest.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("{body:?}"));
    let message: Value = serde_json::from_str(data).unwrap();
    assert_eq!(message["id"], json!(9));
    assert_eq!(message["result"]["structuredContent"], json!({"briqs": []}));
    // Performed, then the stream ends before the answer.
    c.server
        .admin()
        .add_fault(&FaultRule::on(Operation::Create, Fault::SseCutAfterEffect))
        .await
        .unwrap();
    let run = json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call",
        "params": {"name": tools::RUN, "arguments": {"image": "python"}}});
    assert_eq!(event_stream(c.post(&run).await).await, ": briq-local\n\n");
    assert_eq!(c.server.admin().stats().await.unwrap().sandboxes.len(), 1);
    // Other methods keep answering JSON.
    let list = c
        .post(&json!({"jsonrpc": "2.0", "id": 11, "method": "tools/list"}))
        .await;
    assert_eq!(
        list.headers()[CONTENT_TYPE].to_str().unwrap(),
        "application/json"
    );
    c.server.shutdown().await;
}

#[tokio::test]
async fn faults_act_on_the_answer_of_each_counted_call() {
    let c = client().await;
    let admin = c.server.admin();
    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"});
    admin
        .add_fault(&FaultRule::on(
            Operation::ListTools,
            Fault::Status {
                status: 429,
                code: None,
                retry_after_seconds: Some(2),
            },
        ))
        .await
        .unwrap();
    let limited = c.post(&list).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()[RETRY_AFTER].to_str().unwrap(), "2");
    assert_eq!(
        limited.json::<Value>().await.unwrap(),
        json!({"jsonrpc": "2.0", "id": 4, "error": {"code": -32000, "message": "injected fault",
            "data": {"code": "rate_limited"}}})
    );
    admin
        .add_fault(&FaultRule::on(
            Operation::Get,
            Fault::tool_error(ErrorCode::QuotaExceeded),
        ))
        .await
        .unwrap();
    let error = c.tool_error(tools::STATUS, json!({"briq": "bq_any"})).await;
    assert_eq!(error.error.code, ErrorCode::QuotaExceeded);
    admin
        .add_fault(&FaultRule::on(
            Operation::Get,
            Fault::json_rpc_error(-32603),
        ))
        .await
        .unwrap();
    let error = c.refusal(tools::STATUS, json!({"briq": "bq_any"})).await;
    assert_eq!(error, json!({"code": -32603, "message": "injected fault"}));
    admin
        .add_fault(&FaultRule::on(Operation::Initialize, Fault::MalformedJson))
        .await
        .unwrap();
    let initialize = json!({"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {}});
    let malformed = c.post(&initialize).await;
    assert!(malformed.json::<Value>().await.is_err());
    let echoed = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
        "params": {"name": tools::EXEC, "arguments": {"briq": "bq_x", "cmd": ["echo", "s3cret-arg"]}}});
    admin
        .add_fault(&FaultRule::on(Operation::Exec, Fault::echo_request(502)).for_sandbox("bq_x"))
        .await
        .unwrap();
    let page = c.post(&echoed).await;
    assert_eq!(page.status(), StatusCode::BAD_GATEWAY);
    assert!(page.text().await.unwrap().contains("s3cret-arg"));
    let stats = admin.stats().await.unwrap();
    assert_eq!(stats.calls(Operation::Initialize), 2);
    assert_eq!(stats.calls(Operation::ListTools), 1);
    assert_eq!(stats.calls(Operation::Get), 2);
    assert_eq!(stats.calls(Operation::Exec), 1);
    c.server.shutdown().await;
}

#[tokio::test]
async fn a_simulated_sandbox_answers_the_command_inside_the_prelude() {
    let c = client_with(|config| config.simulation = Some(Simulation::default())).await;
    let id = c.run("simulated").await;
    let request = ExecRequest {
        argv: vec!["true".into()],
        cwd: Some("/work".into()),
        env: BTreeMap::new(),
        timeout: Duration::from_secs(5),
        stdin: None,
    };
    let args = serde_json::to_value(ExecArgs::from_request(&id, &request)).unwrap();
    let output = c.answer(tools::EXEC, args).await;
    // `true`, taken out of the prelude, is no bridge command.
    assert_eq!(output["exitCode"], json!(127), "{output}");
    assert!(
        output["stderr"]
            .as_str()
            .unwrap()
            .contains("\"true\" is not python3"),
        "{output}"
    );
    c.server.shutdown().await;
}

#[tokio::test]
async fn the_legacy_rest_surface_is_served_only_when_asked_and_shares_the_sandboxes() {
    let http = reqwest::Client::new();
    let without = client().await;
    let sandboxes = without.server.rest_url().join("v1/sandboxes").unwrap();
    let refused = http.get(sandboxes).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
    without.server.shutdown().await;

    let c = client_with(|config| config.legacy_rest = true).await;
    let id = c.run("shared").await;
    let base = c.server.rest_url();
    assert_eq!(c.server.url().as_str(), format!("{base}mcp"));
    let listed: Value = http
        .get(base.join("v1/sandboxes?name=shared").unwrap())
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sandbox = &listed["sandboxes"][0];
    assert_eq!(sandbox["id"], json!(id), "{listed}");
    assert!(sandbox["created_at"].is_string(), "the old shape: {listed}");
    let exec: Value = http
        .post(base.join(&format!("v1/sandboxes/{id}/exec")).unwrap())
        .bearer_auth(KEY)
        .json(&json!({"argv": ["pwd"], "cwd": "/work", "timeout_seconds": 5}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(exec["exit_code"], json!(0), "{exec}");
    assert_eq!(exec["timed_out"], json!(false));
    assert!(
        exec["stdout"]
            .as_str()
            .unwrap()
            .trim_end()
            .ends_with("/fs/work"),
        "{exec}"
    );
    let gone = http
        .delete(base.join(&format!("v1/sandboxes/{id}")).unwrap())
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), StatusCode::NO_CONTENT);
    let error = c.tool_error(tools::STATUS, json!({"briq": id})).await;
    assert_eq!(error.error.code, ErrorCode::NotFound);
    let wrong = http
        .get(base.join("v1/sandboxes").unwrap())
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["error"]["code"], json!("unauthorized"), "{body}");
    let stats = c.server.admin().stats().await.unwrap();
    assert_eq!(stats.calls(Operation::List), 1);
    assert_eq!(stats.calls(Operation::Destroy), 1);
    c.server.shutdown().await;
}

/// Starts `script` with `sh -c` as an async exec in `sandbox`; its exec id, answered at once.
async fn start_async(client: &Client, sandbox: &str, script: &str) -> String {
    let started = client
        .answer(
            tools::EXEC,
            json!({"briq": sandbox, "cmd": ["sh", "-c", script], "async": true}),
        )
        .await;
    let exec = started["exec"].as_str().unwrap().to_owned();
    assert!(exec.starts_with("ex_"), "{started}");
    exec
}

#[tokio::test]
async fn an_async_exec_answers_at_once_and_its_result_waits_for_its_end() {
    let client = client().await;
    let sandbox = client.run("async").await;
    let exec = start_async(&client, &sandbox, "sleep 30").await;
    let waiting = json!({"briq": sandbox, "exec": exec, "waitMs": 0});
    let running = client.answer(tools::EXEC_RESULT, waiting).await;
    assert_eq!(
        running["state"],
        json!("running"),
        "answered before it ends"
    );
    client
        .answer(tools::EXEC_STOP, json!({"briq": sandbox, "exec": exec}))
        .await;

    let exec = start_async(&client, &sandbox, "echo out; echo err >&2; exit 3").await;
    let ended = client
        .answer(tools::EXEC_RESULT, json!({"briq": sandbox, "exec": exec}))
        .await;
    assert_eq!(
        (
            &ended["state"],
            &ended["exitCode"],
            &ended["stdout"],
            &ended["stderr"]
        ),
        (
            &json!("exited"),
            &json!(3),
            &json!("out\n"),
            &json!("err\n")
        ),
        "{ended}"
    );
    let kept = client
        .answer(
            tools::FILES_GET,
            json!({"briq": sandbox, "path": ended["stdoutPath"]}),
        )
        .await;
    assert_eq!(
        BASE64
            .decode(kept["contentBase64"].as_str().unwrap())
            .unwrap(),
        b"out\n",
        "the whole output is kept in the sandbox: {kept}"
    );
}

#[tokio::test]
async fn output_followed_by_offset_comes_while_the_command_runs_without_gaps_or_repeats() {
    let client = client().await;
    let sandbox = client.run("follow").await;
    let script = "for i in 1 2 3 4 5; do echo \"line $i é\"; sleep 0.2; done";
    let exec = start_async(&client, &sandbox, script).await;
    let (mut followed, mut offset, mut seen_while_running) = (String::new(), 0, false);
    loop {
        let read = client
            .answer(
                tools::EXEC_RESULT,
                json!({"briq": sandbox, "exec": exec, "offset": offset, "maxBytes": 7}),
            )
            .await;
        let output = read["output"].as_str().unwrap();
        seen_while_running |= !output.is_empty() && read["state"] == json!("running");
        followed.push_str(output);
        offset = read["nextOffset"].as_u64().unwrap();
        if read["state"] != json!("running") && output.is_empty() {
            break;
        }
    }
    let expected: String = (1..=5).map(|i| format!("line {i} é\n")).collect();
    assert_eq!(followed, expected);
    assert!(
        seen_while_running,
        "a read by offset ends at new output, not at the command's end"
    );
}

#[tokio::test]
async fn a_stopped_async_exec_stops_every_process_it_started_and_keeps_its_output() {
    let client = client().await;
    let sandbox = client.run("stop").await;
    let script = "setsid sleep 300 & echo started; sleep 300";
    let exec = start_async(&client, &sandbox, script).await;
    let first = client
        .answer(
            tools::EXEC_RESULT,
            json!({"briq": sandbox, "exec": exec, "offset": 0}),
        )
        .await;
    assert_eq!(first["output"], json!("started\n"), "{first}");
    let stopped = client
        .answer(tools::EXEC_STOP, json!({"briq": sandbox, "exec": exec}))
        .await;
    assert_eq!(stopped["state"], json!("stopped"), "{stopped}");
    assert_eq!(stopped["stdout"], json!("started\n"));
    let left = crate::local_server::process::processes_marked(
        crate::local_server::async_exec::EXEC_MARKER,
    )
    .into_iter()
    .filter(|(_, id)| *id == exec)
    .count();
    assert_eq!(left, 0, "the detached sleep went with it");
    let again = client
        .answer(tools::EXEC_STOP, json!({"briq": sandbox, "exec": exec}))
        .await;
    assert_eq!(
        again["state"],
        json!("stopped"),
        "stopping twice is harmless"
    );
}

#[tokio::test]
async fn an_exec_of_another_sandbox_or_none_is_not_found() {
    let client = client().await;
    let (one, other) = (client.run("one").await, client.run("other").await);
    let exec = start_async(&client, &one, "true").await;
    for (sandbox, exec) in [(&other, exec.as_str()), (&one, "ex_missing")] {
        let error = client
            .tool_error(
                tools::EXEC_RESULT,
                json!({"briq": sandbox, "exec": exec, "waitMs": 0}),
            )
            .await;
        assert_eq!(error.error.code, ErrorCode::NotFound, "{exec} in {sandbox}");
    }
    let refused = client
        .refusal(
            tools::EXEC_RESULT,
            json!({"briq": one, "exec": exec, "offset": 0, "maxBytes": 0}),
        )
        .await;
    assert_eq!(
        refused["code"],
        json!(-32602),
        "maxBytes is at least 1: {refused}"
    );
}

#[tokio::test]
async fn a_sandbox_stopped_under_an_async_exec_reports_it_lost() {
    let client = client().await;
    let sandbox = client.run("lost").await;
    let exec = start_async(&client, &sandbox, "sleep 300").await;
    client.answer(tools::STOP, json!({"briq": sandbox})).await;
    let lost = client
        .answer(tools::EXEC_RESULT, json!({"briq": sandbox, "exec": exec}))
        .await;
    assert_eq!(lost["state"], json!("lost"), "{lost}");
}

#[tokio::test]
async fn a_fork_keeps_its_sources_config_and_env_but_not_what_it_wrote_to_its_disk() {
    let c = client().await;
    let source = c
        .answer(
            tools::RUN,
            json!({"image": "python:3.12-slim", "name": "src", "size": "small", "sleep": "3h",
                   "env": {"FROM_SOURCE": "kept"}}),
        )
        .await;
    let source_id = source["id"].as_str().unwrap().to_owned();
    let put = api::FilesPutArgs::new(&source_id, "/work/state.bin", b"source state");
    c.answer(tools::FILES_PUT, serde_json::to_value(put).unwrap())
        .await;
    let fork = c
        .answer(
            tools::FORK,
            json!({"briq": source_id, "name": "bqe-team-fork-1", "sleep": "30m", "wait": true}),
        )
        .await;
    let fork_id = fork["id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, source_id);
    assert_eq!(
        (
            &fork["name"],
            &fork["image"],
            &fork["size"],
            &fork["sleep"],
            &fork["state"]
        ),
        (
            &json!("bqe-team-fork-1"),
            &json!("python:3.12-slim"),
            &json!("small"),
            &json!("30m"),
            &json!("running")
        )
    );
    let env = c
        .answer(
            tools::EXEC,
            json!({"briq": fork_id, "cmd": ["sh", "-c", "echo $FROM_SOURCE; ls /work 2>&1 || true"]}),
        )
        .await;
    let stdout = env["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("kept\n"), "{stdout}");
    assert!(
        !stdout.contains("state.bin"),
        "the source's own disk stayed with it: {stdout}"
    );
    // Without a name or sleep: briq's defaults.
    let defaulted = c.answer(tools::FORK, json!({"briq": source_id})).await;
    assert_eq!(
        (&defaulted["name"], &defaulted["sleep"]),
        (&json!("src-fork"), &json!("3h"))
    );
    c.answer(tools::DESTROY, json!({"briq": source_id})).await;
    let gone = c
        .tool_error(tools::FORK, json!({"briq": source_id, "name": "late"}))
        .await;
    assert_eq!(gone.error.code, ErrorCode::NotFound, "{gone:?}");
    let stack = c.tool_error(tools::FORK, json!({"into": "x"})).await;
    assert!(stack.error.message.contains("not supported"), "{stack:?}");
}
