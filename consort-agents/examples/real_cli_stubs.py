"""Loopback model servers for examples/real_cli.rs: the Responses API (for codex) and the
Messages API (for Claude Code), streaming, scripted for one GREEN step (edit src/stock.sql
through the CLI's own tools) and one REVIEW step (answer with a review verdict).

    python3 real_cli_stubs.py responses 18777    # codex:  base_url http://127.0.0.1:18777/v1
    python3 real_cli_stubs.py messages 18778     # claude: ANTHROPIC_BASE_URL=http://127.0.0.1:18778
"""
import http.server
import json
import re
import sys

VERDICT = '{"kind": "review-verdict", "body": {"decision": "approve", "notes": ["fine"]}}'
NEW = "select quantity from stock_records;\n"


def sse(name, data):
    return ("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode()


def responses(body):
    """One turn of the Responses API: a verdict, an exec_command call, or a final message."""
    text = json.dumps(body)
    called = any(isinstance(i, dict) and i.get("type") == "function_call_output"
                 for i in body.get("input", []))
    if "review-verdict" in text:
        item = {"type": "message", "id": "msg_1", "role": "assistant",
                "content": [{"type": "output_text", "text": VERDICT}]}
    elif not called:
        cmd = "printf '%s' > src/stock.sql" % NEW.replace("\n", "\\n")
        item = {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                "name": "exec_command", "arguments": json.dumps({"cmd": cmd})}
    else:
        item = {"type": "message", "id": "msg_2", "role": "assistant",
                "content": [{"type": "output_text", "text": "Changed src/stock.sql."}]}
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 120}
    return (sse("response.created", {"type": "response.created", "response": {"id": "r"}})
            + sse("response.output_item.done",
                  {"type": "response.output_item.done", "output_index": 0, "item": item})
            + sse("response.completed",
                  {"type": "response.completed", "response": {"id": "r", "usage": usage}}))


def messages(body):
    """One turn of the Messages API: a verdict, Read then Write of src/stock.sql, or text."""
    text = json.dumps(body)
    results = text.count('"tool_result"')
    root = re.search(r"(/tmp/consort-scratch-[A-Za-z0-9_]+)", text)
    path = (root.group(1) if root else "/nonexistent") + "/src/stock.sql"
    if "review-verdict" in text:
        block = {"type": "text", "text": VERDICT}
    elif results == 0:
        block = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": path}}
    elif results == 1:
        block = {"type": "tool_use", "id": "toolu_2", "name": "Write",
                 "input": {"file_path": path, "content": NEW}}
    else:
        block = {"type": "text", "text": "Changed src/stock.sql."}
    stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model", "m"),
           "content": [], "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": 100, "output_tokens": 1}}
    out = sse("message_start", {"type": "message_start", "message": msg})
    if block["type"] == "text":
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    out += sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start})
    out += sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    out += sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    out += sse("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": 20}})
    return out + sse("message_stop", {"type": "message_stop"})


class Handler(http.server.BaseHTTPRequestHandler):
    api = None

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.loads(raw or b"{}")
        out = Handler.api(body)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    Handler.api = {"responses": responses, "messages": messages}[sys.argv[1]]
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
