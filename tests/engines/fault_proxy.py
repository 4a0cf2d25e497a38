"""A fault-injecting HTTP proxy for the tests: it listens on 127.0.0.1, forwards each request to a real server
(the vLLM OpenAI server the tests start), and misbehaves on the requests a rule picks.

One request per client connection (answers carry `Connection: close`, so the client opens a new connection for the
next one); the upstream answer is read whole and de-chunked before a fault is applied. Every request is recorded
(path, JSON body, fault applied), so a test can count what the harness sent.

Faults: "drop" (close without answering), "stall" (answer nothing for `stall_s`, then close), "truncate" (send
half the body under the full Content-Length, then close), "500" / "503" (an error status, not forwarded),
"malformed" (the answer's JSON cut short, under a Content-Length that matches), "fewer_logprobs" (the answer with
logprobs for two steps fewer than the tokens it returns), "cut_character" (the first non-ASCII character of the
answer's text written as U+FFFD, as a detokeniser that cut its bytes writes it; streamed: in the first chunk holding
one).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Rule = Callable[[str, dict[str, Any], int], str | None]  # (path, JSON body, attempts with this body) -> fault


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    fault: str | None


@dataclass
class FaultProxy:
    upstream: tuple[str, int]
    rule: Rule
    stall_s: float = 10.0
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.attempts: dict[str, int] = {}
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.closed.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            try:
                head, body = _read_request(client)
            except (OSError, ValueError):
                return
            path = head.split(b" ", 2)[1].decode()
            payload = _json(body)
            key = json.dumps(payload, sort_keys=True)
            with self.lock:
                self.attempts[key] = self.attempts.get(key, 0) + 1
                fault = self.rule(path, payload, self.attempts[key]) if head.startswith(b"POST") else None
                self.seen.append(Seen(path, payload, fault))
            if fault == "drop":
                return
            if fault == "stall":
                time.sleep(self.stall_s)
                return
            if fault in ("500", "503"):
                error = json.dumps({"error": {"message": f"injected {fault}"}}).encode()
                client.sendall(_response(int(fault), error))
                return
            status, answer = _forward(self.upstream, head, body)
            if fault == "truncate":
                whole = _response(status, answer)
                client.sendall(whole[: len(whole) - len(answer) // 2])
                return
            if fault == "malformed":
                answer = answer[: len(answer) // 2]
            elif fault == "fewer_logprobs":
                answer = _drop_logprob_steps(answer, 2)
            elif fault == "cut_character":
                answer = _cut_character(answer)
            client.sendall(_response(status, answer))


def _read_request(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("connection closed before the request's headers")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("connection closed inside the request's body")
        body += chunk
    return head, body


def _json(body: bytes) -> dict[str, Any]:
    try:
        return json.loads(body) if body else {}
    except ValueError:
        return {}


def _forward(upstream: tuple[str, int], head: bytes, body: bytes) -> tuple[int, bytes]:
    """Send the request upstream with `Connection: close`; return its status and de-chunked body."""
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    request = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
    with socket.create_connection(upstream) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    chunked = any(line.lower().replace(b" ", b"") == b"transfer-encoding:chunked" for line in head.split(b"\r\n"))
    return status, _dechunk(rest) if chunked else rest


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out


def _response(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Status")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def _drop_logprob_steps(answer: bytes, steps: int) -> bytes:
    """A completions answer whose logprobs lists lose their last `steps` entries (token ids and text untouched)."""
    payload = json.loads(answer)
    for choice in payload["choices"]:
        logprobs = choice["logprobs"]
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            if logprobs.get(key) is not None:
                logprobs[key] = logprobs[key][:-steps]
    return json.dumps(payload).encode()


def _cut_character(answer: bytes) -> bytes:
    text = answer.decode()
    if not text.lstrip().startswith("data:"):
        payload = json.loads(text)
        _cut_first(payload)
        return json.dumps(payload).encode()
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            payload = json.loads(line[5:])
            if _cut_first(payload):
                lines[i] = "data: " + json.dumps(payload)
                break
    return "\n".join(lines).encode()


def _cut_first(payload: dict[str, Any]) -> bool:
    for choice in payload.get("choices") or []:
        text = choice.get("text") or ""
        at = next((j for j, char in enumerate(text) if ord(char) > 127), None)
        if at is not None:
            choice["text"] = text[:at] + "\ufffd" + text[at + 1:]
            return True
    return False
