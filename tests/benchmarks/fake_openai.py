"""A tiny fake OpenAI chat server on loopback for the benchmark tests: streams
fake chunks (no model), in-process (`make_app`) or as a child process
(`python tests/benchmarks/fake_openai.py --port N`, what `fake_server.FakeServer`
starts).

Kept free of project imports so the child process starts in a fraction of a
second. The first user message picks a behaviour:
- `fail-429` / `fail-503`: refused with `Retry-After: 1`; `fail-503-bare`: without it;
- `stream-error`: two tokens, then an SSE error event;
- `drop`: two tokens, then the connection is cut;
- `multi`: tokens in chunks of 3;
- `no-usage`: no usage chunk;
- anything else: `max_tokens` tokens with `ignore_eos`, else min(max_tokens, 5).
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web


def _chunk(choices: list, usage: dict | None = None) -> bytes:
    data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake", "choices": choices}
    if usage is not None:
        data["usage"] = usage
    return f"data: {json.dumps(data)}\n\n".encode()


def make_app(token_delay_s: float = 0.001) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = body.get("messages") or []
        prompt = messages[0]["content"] if messages else f"template:{body.get('template')}"
        if prompt.startswith("fail-"):
            headers = {} if prompt.endswith("-bare") else {"Retry-After": "1"}
            return web.json_response({"error": {"message": "busy"}}, status=int(prompt[5:8]), headers=headers)
        max_tokens = body.get("max_tokens") or 16
        tokens = max_tokens if body.get("ignore_eos") else min(max_tokens, 5)
        if not body.get("stream"):
            return web.json_response({"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                                      "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}]))
        step = 3 if prompt == "multi" else 1
        sent = 0
        while sent < tokens:
            await asyncio.sleep(token_delay_s)
            n = min(step, tokens - sent)
            sent += n
            reason = "length" if sent == tokens else None
            text = "Paris. " if "France" in prompt else "tok " * n
            await response.write(_chunk([{"index": 0, "delta": {"content": text}, "finish_reason": reason}]))
            if sent == 2 and prompt == "stream-error":
                await response.write(b'data: {"error": {"message": "replica lost", "code": 503}}\n\n')
                return response
            if sent == 2 and prompt == "drop":
                request.transport.close()
                return response
        if prompt != "no-usage":
            await response.write(_chunk([], {"prompt_tokens": 3, "completion_tokens": tokens,
                                             "total_tokens": tokens + 3}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def stats(_: web.Request) -> web.Response:
        return web.json_response({"predictor_classes": {}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay-s", type=float, default=0.001)
    args = parser.parse_args()
    web.run_app(make_app(args.token_delay_s), host="127.0.0.1", port=args.port, print=None)
