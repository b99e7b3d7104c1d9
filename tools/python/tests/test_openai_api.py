"""troupe serve's OpenAI-compatible HTTP API (issue 13), driven by the
official `openai` package against a live server: completions and chat
completions, streamed and not; greedy output equal to offline `troupe
generate`; n samples reproducible with a seed; logprobs consistent with the
tokens; OpenAI's error objects with the right statuses."""

import json
import math
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import Server, troupe_bin
from troupe_client.local_port import free_port

PROMPT = "Once upon a time"


class HttpServer(Server):
    def __init__(self, *extra, model="stories15m"):
        self.port = free_port()
        super().__init__("--http-port", str(self.port), *extra, model=model)
        self.base = f"http://127.0.0.1:{self.port}"
        until = time.monotonic() + 30
        while time.monotonic() < until:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail("the HTTP API did not answer /health")

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, **kw)


@pytest.fixture(scope="module")
def stories():
    s = HttpServer()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def smol():
    s = HttpServer(model="smollm2-135m-instruct")
    yield s
    s.stop()


def offline(model: str, prompt: str, n: int) -> dict:
    r = subprocess.run([troupe_bin(), "generate", "-m", model, "--ignore-eos", "--json", "-n", str(n),
                        "-p", prompt], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_models_lists_the_served_name(stories):
    models = stories.client().models.list()
    assert [m.id for m in models.data] == ["stories15m"]


def test_greedy_completion_equals_offline_generate(stories):
    want = offline("stories15m", PROMPT, 24)
    c = stories.client()
    r = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=24, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.choices[0].text == want["text"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 24
    assert r.usage.prompt_tokens > 0
    # Streamed: the deltas concatenate to the same text; the usage comes last.
    stream = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=24, temperature=0,
                                  stream=True, stream_options={"include_usage": True},
                                  extra_body={"ignore_eos": True})
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.text
            finish = ch.finish_reason or finish
    assert text == want["text"]
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 24
    # Token-id prompts and echo.
    r = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=4, temperature=0,
                             echo=True)
    assert r.choices[0].text.startswith(PROMPT)


def test_chat_completions_streamed_and_not(smol):
    c = smol.client()
    msgs = [{"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Name a colour."}]
    r = c.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, max_tokens=16,
                                  temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    stream = c.chat.completions.create(model="smollm2-135m-instruct", messages=msgs, max_tokens=16,
                                       temperature=0, stream=True)
    roles, text = [], ""
    for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            text += ch.delta.content or ""
    assert roles == ["assistant"]
    assert text == r.choices[0].message.content


LONG = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends. One day, she saw a big red ball under a tree and ran to get it.")


def kv(server) -> dict:
    r = subprocess.run([troupe_bin(), "client", "--server", server.endpoint, "admin", "kv",
                        "--json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_n_samples_are_reproducible_with_a_seed_and_share_the_prompt(stories):
    c = stories.client()
    def sample(prompt):
        r = c.completions.create(model="stories15m", prompt=prompt, max_tokens=16,
                                 temperature=1.0, n=4, seed=7)
        assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
        return [ch.text for ch in r.choices], r.usage.prompt_tokens
    first, _ = sample(PROMPT)
    again, _ = sample(PROMPT)
    assert first == again
    assert len(set(first)) > 1, "four samples with different seeds should not all agree"
    # The prompt's full pages are computed once: the other three samples
    # find them in the prefix cache (16-token pages).
    before = kv(stories)["prefix_hit_tokens"]
    _, prompt_tokens = sample(LONG)
    full = (prompt_tokens - 1) // 16 * 16
    assert full >= 32
    assert kv(stories)["prefix_hit_tokens"] - before >= 3 * full


def test_logprobs_match_the_sampled_tokens(stories, smol):
    c = stories.client()
    r = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=8, temperature=0,
                             logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 8 and "".join(lp.tokens) == r.choices[0].text
    for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0
        assert len(top) == 3
        # Greedy: the token is the most likely one.
        assert math.isclose(max(top.values()), logprob, abs_tol=1e-5)
        assert top[tok] == logprob
    r = smol.client().chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 2
        assert math.isclose(t.top_logprobs[0].logprob, t.logprob, abs_tol=1e-5)


def test_logit_bias_bans_and_forces_tokens(stories, smol):
    # OpenAI's logit_bias through the SDK: a token id (as OpenAI's tokenizer
    # would give it; here troupe's /tokenize) and a bias in [-100, 100].
    c = stories.client()
    plain = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=6, temperature=0,
                                 logprobs=1)
    first = plain.choices[0].logprobs.tokens[0]
    # The first token's id: what the prompt with it tokenizes to, past the prompt.
    _, _, before = http_json("POST", stories.base + "/tokenize", {"content": PROMPT})
    _, _, after = http_json("POST", stories.base + "/tokenize", {"content": PROMPT + first})
    assert after["tokens"][:-1] == before["tokens"]
    banned = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=6, temperature=0,
                                  logprobs=1, logit_bias={str(after["tokens"][-1]): -100})
    assert banned.choices[0].logprobs.tokens[0] != first
    _, _, the = http_json("POST", stories.base + "/tokenize", {"content": " the"})
    forced = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=5, temperature=0.9,
                                  seed=4, logit_bias={str(the["tokens"][-1]): 100})
    assert forced.choices[0].text == " the" * 5
    # Chat, streamed, on the other model.
    _, _, yes = http_json("POST", smol.base + "/tokenize", {"content": "Yes"})
    stream = smol.client().chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
        temperature=0, stream=True, logit_bias={str(yes["tokens"][-1]): 100})
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == "Yes" * 3
    for bad in ({"x": 1}, {"5": 101}, {"99999999": 1}):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="stories15m", prompt="x", max_tokens=2, logit_bias=bad)
        assert e.value.status_code == 400 and "logit_bias" in str(e.value), bad


def test_the_responses_api_for_text(smol):
    # POST /v1/responses through the SDK: the same tokens as the chat
    # completion it stands for, the typed stream events, the SDK's stream
    # helper and parse(), and what it cannot do refused by name.
    c = smol.client()
    m = "smollm2-135m-instruct"
    q = "What is the capital of France?"
    r = c.responses.create(model=m, input=q, max_output_tokens=12, temperature=0)
    chat = c.chat.completions.create(model=m, messages=[{"role": "user", "content": q}],
                                     max_tokens=12, temperature=0)
    assert r.output_text == chat.choices[0].message.content
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 12 and r.usage.input_tokens == chat.usage.prompt_tokens
    r = c.responses.create(model=m, instructions="Answer in one word.", max_output_tokens=100,
                           input=[{"role": "user", "content": [{"type": "input_text", "text": q}]}],
                           temperature=0)
    assert r.status == "completed" and r.output[0].content[0].type == "output_text"
    events = list(c.responses.create(model=m, input=q, max_output_tokens=12, temperature=0,
                                     stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events[4:-4]) == chat.choices[0].message.content
    with c.responses.stream(model=m, input="Say hi", max_output_tokens=100, temperature=0) as st:
        final = st.get_final_response()
    assert final.status == "completed" and final.output_text

    import pydantic

    class City(pydantic.BaseModel):
        name: str
        country: str

    p = c.responses.parse(model=m, input="Name a city in France.", text_format=City,
                          max_output_tokens=60, temperature=0)
    assert isinstance(p.output_parsed, City)
    for bad in ({"previous_response_id": "resp_1"},
                {"tools": [{"type": "function", "name": "f", "parameters": {}}]},
                {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}):
        kw = {"model": m, "input": "x", **bad}
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(**kw)
        assert e.value.status_code == 400, bad


def test_errors_get_openai_statuses_and_objects(stories):
    c = stories.client()
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert e.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="stories15m", prompt="x", max_tokens=2, temperature=7)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="stories15m", prompt="x", max_tokens=2, extra_body={"n": 99})
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="stories15m", prompt=[1, 2, 1 << 30], max_tokens=2)
    # Not JSON at all: an error object, not a dropped connection.
    req = urllib.request.Request(stories.base + "/v1/completions", data=b"{nope",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    assert "error" in json.loads(e.value.read())


def test_overload_is_429_and_draining_is_503():
    s = HttpServer("--max-inflight", "1", "--grace-s", "20")
    try:
        c = s.client()
        hold = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=200,
                                    temperature=0, stream=True, extra_body={"ignore_eos": True})
        it = iter(hold)
        next(it)
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model="stories15m", prompt="x", max_tokens=2)
        assert e.value.status_code == 429
        s.proc.send_signal(signal.SIGTERM)
        # The held request keeps the drain from ending, but only for as
        # long as its 200 tokens take (a fifth of a second on this engine):
        # poll for the drain's 503 instead of sleeping a fixed time.
        deadline = time.time() + 5
        while True:
            try:
                c.completions.create(model="stories15m", prompt="x", max_tokens=2)
                pytest.fail("a request was admitted past the in-flight limit")
            except openai.InternalServerError as e:
                assert e.status_code == 503
                break
            except openai.RateLimitError:
                assert time.time() < deadline, "no 503 within 5 s of SIGTERM"
                time.sleep(0.01)
        with urllib.request.urlopen(s.base + "/health", timeout=5) as r:
            pytest.fail(f"/health answered {r.status} while draining")
    except urllib.error.HTTPError as e:
        assert e.code == 503
    finally:
        s.stop()


def test_a_client_leaving_mid_stream_cancels_its_request(stories):
    c = stories.client(timeout=30)
    stream = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=200,
                                  temperature=0, stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it)
    stream.close()  # the connection goes
    # The server cancels it: nothing stays in flight.
    admin = [troupe_bin(), "client", "--server", stories.endpoint, "admin", "requests", "--json"]
    until = time.monotonic() + 10
    while time.monotonic() < until:
        left = json.loads(subprocess.run(admin, capture_output=True, text=True).stdout)
        if not left:
            break
        time.sleep(0.1)
    assert left == []


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer"},
        "height": {"type": "number"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 16},
                                   "zip": {"type": "integer"}}},
    },
}


def valid_person(p) -> bool:
    if list(p) != ["name", "age", "height", "role", "tags", "address"]:
        return False
    ok = (isinstance(p["name"], str) and 1 <= len(p["name"]) <= 16
          and isinstance(p["age"], int) and not isinstance(p["age"], bool)
          and isinstance(p["height"], (int, float)) and not isinstance(p["height"], bool)
          and p["role"] in ("admin", "user", "guest")
          and isinstance(p["tags"], list) and len(p["tags"]) <= 3
          and all(isinstance(t, str) and len(t) <= 10 for t in p["tags"])
          and list(p["address"]) == ["city", "zip"]
          and isinstance(p["address"]["city"], str) and len(p["address"]["city"]) <= 16
          and isinstance(p["address"]["zip"], int))
    return ok


def fifty(server, messages, **kw):
    """50 sampled outputs: 5 requests of n = 10 at once, seeds 0 to 4."""
    from concurrent.futures import ThreadPoolExecutor
    c = server.client(timeout=600)
    def one(seed):
        r = c.chat.completions.create(model="smollm2-135m-instruct", messages=messages,
                                      max_tokens=300, temperature=1.0, n=10, seed=seed, **kw)
        return [(ch.message.content, ch.finish_reason) for ch in r.choices]
    with ThreadPoolExecutor(5) as ex:
        return [x for part in ex.map(one, range(5)) for x in part]


def test_structured_output_always_parses_and_validates(smol):
    import re
    people = fifty(smol, [{"role": "user", "content": "Describe a person as JSON."}],
                   response_format={"type": "json_schema",
                                    "json_schema": {"name": "person", "schema": PERSON}})
    assert len(people) == 50
    for text, finish in people:
        assert finish == "stop", text
        assert valid_person(json.loads(text)), text
    phones = fifty(smol, [{"role": "user", "content": "Give me a phone number."}],
                   extra_body={"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})
    for text, finish in phones:
        assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", text), text
    colours = fifty(smol, [{"role": "user", "content": "Name a colour."}],
                    extra_body={"guided_choice": ["red", "green", "blue"]})
    for text, finish in colours:
        assert text in ("red", "green", "blue"), text
    assert len({t for t, _ in colours}) > 1
    # An unsupported schema feature is refused by name, up front.
    with pytest.raises(openai.BadRequestError) as e:
        smol.client().chat.completions.create(
            model="smollm2-135m-instruct", messages=[{"role": "user", "content": "x"}],
            max_tokens=8, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"allOf": [{"type": "string"}]}}})
    assert "'allOf' is not supported" in str(e.value)


def test_nested_pydantic_models_parse(smol):
    # Issue 34: chat.completions.parse sends pydantic's schema: nested models
    # as $defs/$ref, a pattern, formats, a list of models and an optional one.
    import datetime
    import typing
    import uuid

    import pydantic

    class Pet(pydantic.BaseModel):
        kind: typing.Literal["cat", "dog", "fish"]
        born: datetime.date

    class Owner(pydantic.BaseModel):
        code: str = pydantic.Field(pattern=r"^[A-Z]{2}-[0-9]{3}$")
        id: uuid.UUID
        pets: typing.List[Pet] = pydantic.Field(max_length=2)
        favourite: typing.Optional[Pet]

    c = smol.client()
    for seed in range(3):
        r = c.chat.completions.parse(
            model="smollm2-135m-instruct", max_tokens=200, temperature=0.8, seed=seed,
            messages=[{"role": "user", "content": "Describe a pet owner as JSON."}],
            response_format=Owner)
        owner = r.choices[0].message.parsed
        assert isinstance(owner, Owner), r.choices[0].message.content
        assert len(owner.pets) <= 2


def http_json(method: str, url: str, body=None, headers=None):
    """(status, headers, JSON body) of one request; error statuses too."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, r.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, e.headers, json.loads(raw) if raw else None


def test_an_api_key_is_refused_wrong_and_accepted_right(tmp_path):
    # Issue 34: --api-key / --api-key-file, 401 with OpenAI's error body.
    key_file = tmp_path / "keys"
    key_file.write_text("second-key\n")
    key_file.chmod(0o600)
    s = HttpServer("--api-key", "first-key", "--api-key-file", str(key_file))
    try:
        for bad in ("none", "first-ke", "first-key2", ""):
            c = openai.OpenAI(base_url=s.base + "/v1", api_key=bad or "x", max_retries=0)
            with pytest.raises(openai.AuthenticationError) as e:
                c.models.list()
            assert e.value.status_code == 401
            assert e.value.body["code"] == "invalid_api_key"
        for good in ("first-key", "second-key"):
            c = openai.OpenAI(base_url=s.base + "/v1", api_key=good, max_retries=0)
            assert [m.id for m in c.models.list().data] == ["stories15m"]
            r = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=2)
            assert r.usage.completion_tokens == 2
        # /health needs no key (load balancers probe it).
        status, _, body = http_json("GET", s.base + "/health")
        assert status == 200 and body["status"] == "ok"
        status, _, body = http_json("POST", s.base + "/tokenize", {"content": "x"})
        assert status == 401
    finally:
        s.stop()


def test_models_by_id_tokenize_detokenize_and_unknown_routes(stories):
    c = stories.client()
    m = c.models.retrieve("stories15m")
    assert m.id == "stories15m" and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"
    # llama-server's /tokenize and /detokenize shapes; a round trip.
    status, _, body = http_json("POST", stories.base + "/tokenize", {"content": PROMPT})
    assert status == 200 and all(isinstance(t, int) for t in body["tokens"])
    ids = body["tokens"]
    status, _, with_bos = http_json("POST", stories.base + "/tokenize",
                                    {"content": PROMPT, "add_special": True, "with_pieces": True})
    assert status == 200 and [t["id"] for t in with_bos["tokens"]][1:] == ids
    assert "".join(t["piece"] for t in with_bos["tokens"][1:]).strip() == PROMPT
    status, _, text = http_json("POST", stories.base + "/detokenize", {"tokens": ids})
    assert status == 200 and text["content"].strip() == PROMPT
    # The ids' completion equals the text's.
    r = c.completions.create(model="stories15m", prompt=ids, max_tokens=8, temperature=0)
    r2 = c.completions.create(model="stories15m", prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.choices[0].text == r2.choices[0].text
    for bad in ({"tokens": [1, -1]}, {"tokens": [2**40]}, {"tokens": "x"}, {}):
        status, _, body = http_json("POST", stories.base + "/detokenize", bad)
        assert status == 400 and body["error"]["param"] == "tokens", bad
    status, _, body = http_json("POST", stories.base + "/tokenize", {"content": 5})
    assert status == 400 and body["error"]["param"] == "content"
    # /metrics on the API port too (Prometheus text, refreshed each second).
    text = ""
    until = time.monotonic() + 10
    while "troupe_requests_total" not in text and time.monotonic() < until:
        try:
            with urllib.request.urlopen(stories.base + "/metrics", timeout=10) as r:
                text = r.read().decode()
                assert r.headers["Content-Type"].startswith("text/plain")
        except urllib.error.HTTPError as e:
            assert e.code == 503  # still gathering the first time
        time.sleep(0.2)
    assert "troupe_requests_total" in text
    # Unknown routes: OpenAI's error body, never an empty 404.
    for method, path in (("GET", "/v1/nothing"), ("POST", "/v2/completions"), ("GET", "/")):
        status, _, body = http_json(method, stories.base + path, {} if method == "POST" else None)
        assert status == 404 and body["error"]["code"] == "not_found", (method, path)
    # A body declared past the limit, on every route: 413 before it is sent.
    for path in ("/tokenize", "/detokenize", "/v1/completions"):
        with socket.create_connection(("127.0.0.1", stories.port), timeout=10) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {9 << 20}\r\n\r\n".encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 413"), path


def test_the_body_limit_is_a_setting():
    # service.http_max_body_bytes: a body past it is refused with 413 before
    # it is read; one within it is served.
    s = HttpServer("--http-max-body-bytes", "4096")
    try:
        big = json.dumps({"model": "stories15m", "prompt": "x" * 5000, "max_tokens": 1}).encode()
        req = urllib.request.Request(s.base + "/v1/completions", data=big, method="POST",
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 413
        small = {"model": "stories15m", "prompt": "Once upon a time", "max_tokens": 2}
        status, _, body = http_json("POST", s.base + "/v1/completions", small)
        assert status == 200, body
    finally:
        s.stop()


def test_cors_preflight_and_listed_origins_only():
    s = HttpServer("--cors-origins", "http://app.example,http://localhost:3000")
    try:
        req = urllib.request.Request(s.base + "/v1/chat/completions", method="OPTIONS", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
        status, headers, _ = http_json("GET", s.base + "/v1/models",
                                       headers={"Origin": "http://localhost:3000"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        status, headers, _ = http_json("GET", s.base + "/v1/models",
                                       headers={"Origin": "http://evil.example"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] is None
    finally:
        s.stop()


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a timezone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}}}}}


def test_tools_named_required_auto_and_a_two_turn_conversation(smol):
    # Issue 34: tools were silently ignored.
    c = smol.client()
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    # A named choice: one call of that function, its arguments valid JSON
    # of its schema; finish_reason tool_calls.
    r = c.chat.completions.create(model="smollm2-135m-instruct", messages=ask, max_tokens=80,
                                  tools=[WEATHER, CLOCK],
                                  tool_choice={"type": "function",
                                               "function": {"name": "get_weather"}})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", msg
    assert len(msg.tool_calls) == 1 and msg.tool_calls[0].function.name == "get_weather"
    args = json.loads(msg.tool_calls[0].function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    assert msg.tool_calls[0].id.startswith("call_") and msg.tool_calls[0].type == "function"
    # required: at least one call, of any tool.
    r = c.chat.completions.create(model="smollm2-135m-instruct", messages=ask, max_tokens=120,
                                  tools=[WEATHER, CLOCK], tool_choice="required")
    calls = r.choices[0].message.tool_calls
    assert calls and all(t.function.name in ("get_weather", "get_time") for t in calls)
    for t in calls:
        assert isinstance(json.loads(t.function.arguments), dict)
    # auto: a call or text, either well formed.
    r = c.chat.completions.create(model="smollm2-135m-instruct", messages=ask, max_tokens=60,
                                  tools=[WEATHER], tool_choice="auto", temperature=0)
    m = r.choices[0].message
    assert (m.tool_calls and r.choices[0].finish_reason == "tool_calls") or m.content is not None
    # The second turn: the assistant's call and the tool's result go back.
    r2 = c.chat.completions.create(
        model="smollm2-135m-instruct", max_tokens=24, tools=[WEATHER],
        messages=ask + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather",
                              "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}])
    assert r2.choices[0].message.content or r2.choices[0].message.tool_calls
    # Streamed: the call arrives as a tool_calls delta, then the finish.
    stream = c.chat.completions.create(
        model="smollm2-135m-instruct", messages=ask, max_tokens=80, stream=True,
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    deltas, finish = [], None
    for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.tool_calls:
                deltas += ch.delta.tool_calls
            finish = ch.finish_reason or finish
    assert finish == "tool_calls" and deltas[0].function.name == "get_weather"
    assert json.loads(deltas[0].function.arguments)["unit"] in ("celsius", "fahrenheit")
    # Garbage is a 400 that names it, never silence.
    for bad in ({"tools": "all"}, {"tools": [WEATHER], "tool_choice": "sometimes"},
                {"tools": [WEATHER], "tool_choice": {"type": "function",
                                                     "function": {"name": "nope"}}}):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="smollm2-135m-instruct", messages=ask, max_tokens=4,
                                      **bad)
        assert e.value.body["param"] in ("tools", "tool_choice"), bad


def test_langchain_bind_tools_and_structured_output_by_function_calling(smol):
    # Issue 34: bind_tools returned [] and with_structured_output(method=
    # "function_calling") None.
    import pydantic
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=smol.base + "/v1", api_key="none", model="smollm2-135m-instruct",
                     max_tokens=80, temperature=0, max_retries=0)

    @tool
    def get_weather(city: str, unit: str) -> str:
        """The weather in a city."""
        return "sunny"

    m = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather in Paris?")
    assert len(m.tool_calls) == 1 and m.tool_calls[0]["name"] == "get_weather"
    assert set(m.tool_calls[0]["args"]) == {"city", "unit"}

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        age: int

    p = llm.with_structured_output(Person, method="function_calling").invoke("Describe a person.")
    assert isinstance(p, Person)


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_through_the_sdk_and_langchain(smol):
    # Issue 34: /v1/embeddings was a 404.  The SDK asks for base64 unless
    # told otherwise; both encodings must give the same vectors.
    c = smol.client()
    texts = ["The cat sat on the mat.", "A cat was sitting on a mat.",
             "Quarterly revenue grew by four percent."]
    r = c.embeddings.create(model="smollm2-135m-instruct", input=texts)
    vecs = [d.embedding for d in r.data]
    assert [d.index for d in r.data] == [0, 1, 2]
    assert all(len(v) == 576 for v in vecs)
    assert all(abs(sum(x * x for x in v) - 1.0) < 1e-4 for v in vecs)
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens
    as_float = c.embeddings.create(model="smollm2-135m-instruct", input=texts[0],
                                   encoding_format="float")
    assert cosine(as_float.data[0].embedding, vecs[0]) > 0.999999
    # Paraphrases are nearer each other than an unrelated sentence.
    assert cosine(vecs[0], vecs[1]) > cosine(vecs[0], vecs[2])
    # Token ids embed as the text they spell.
    ids = json.loads(urllib.request.urlopen(urllib.request.Request(
        smol.base + "/tokenize", data=json.dumps({"content": texts[0]}).encode(),
        headers={"Content-Type": "application/json"}), timeout=30).read())["tokens"]
    by_ids = c.embeddings.create(model="smollm2-135m-instruct", input=[ids])
    assert cosine(by_ids.data[0].embedding, vecs[0]) > 0.999999
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(model="smollm2-135m-instruct", input="x", dimensions=64)
    assert "'dimensions' is not supported" in str(e.value)

    from langchain_openai import OpenAIEmbeddings
    lc = OpenAIEmbeddings(base_url=smol.base + "/v1", api_key="none", model="smollm2-135m-instruct",
                          check_embedding_ctx_length=False, max_retries=0)
    docs = lc.embed_documents(texts)
    assert len(docs) == 3 and cosine(docs[0], vecs[0]) > 0.999999
    assert cosine(lc.embed_query(texts[2]), vecs[2]) > 0.999999


def test_json_object_closes_within_max_tokens(smol):
    # Issue 34: json_object ran to the length limit filling one string.
    # The constraint now keeps room to close: every output parses.
    c = smol.client()
    for max_tokens in (12, 24, 48):
        r = c.chat.completions.create(
            model="smollm2-135m-instruct", max_tokens=max_tokens, temperature=1, seed=5, n=4,
            messages=[{"role": "user", "content": "Write a long story as a JSON object."}],
            response_format={"type": "json_object"})
        for ch in r.choices:
            assert isinstance(json.loads(ch.message.content), dict), ch.message.content
            # Closed by the model's end token, within the budget: not cut.
            assert ch.finish_reason == "stop", (max_tokens, ch.message.content)


def test_litellm_completion_stream_tools_and_embeddings(smol, monkeypatch):
    # Issue 34: the clients users already run, litellm among them (its
    # "openai/" provider against an OpenAI-compatible base).
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    import litellm

    common = dict(model="openai/smollm2-135m-instruct", api_base=smol.base + "/v1",
                  api_key="none", num_retries=0)
    msgs = [{"role": "user", "content": "Say hello."}]
    r = litellm.completion(messages=msgs, max_tokens=12, temperature=0, **common)
    text = r.choices[0].message.content
    assert text and r.usage.completion_tokens <= 12
    streamed = "".join(chunk.choices[0].delta.content or ""
                       for chunk in litellm.completion(messages=msgs, max_tokens=12, temperature=0,
                                                       stream=True, **common))
    assert streamed == text
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    t = litellm.completion(messages=[{"role": "user", "content": "Weather in Paris?"}],
                           tools=[weather], max_tokens=40, temperature=0,
                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                           **common)
    calls = t.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)
    e = litellm.embedding(input=["one", "two"], **common)
    assert len(e.data) == 2 and len(e.data[0]["embedding"]) == 576


async def test_async_openai_concurrent_streams_and_embeddings(smol):
    # Issue 34: the SDK's asyncio client, many streams at once on the
    # event-driven front; each equal to the same request sent alone.
    import asyncio

    c = openai.AsyncOpenAI(base_url=smol.base + "/v1", api_key="none", max_retries=0)
    ask = dict(model="smollm2-135m-instruct", max_tokens=16, temperature=0)

    async def one(i):
        text = ""
        stream = await c.chat.completions.create(
            messages=[{"role": "user", "content": f"Count to {i}."}], stream=True, **ask)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        return text

    texts = await asyncio.gather(*(one(i) for i in range(16)))
    sync = smol.client()
    for i in (0, 9):
        alone = sync.chat.completions.create(
            messages=[{"role": "user", "content": f"Count to {i}."}], **ask)
        assert alone.choices[0].message.content == texts[i]
    e = await c.embeddings.create(model="smollm2-135m-instruct", input=["one", "two"])
    assert [d.index for d in e.data] == [0, 1] and len(e.data[1].embedding) == 576
    await c.close()
