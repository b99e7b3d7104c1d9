"""The Python client against a real `troupe serve` (stories15m, loopback)."""

import asyncio

import pytest
import zmq

from troupe_client import AsyncClient, Client, TroupeError, client_pb2 as pb

from conftest import Server, offline_generate

PROMPT = "Once upon a time there was a dog"


@pytest.fixture
def client(endpoint):
    with Client(endpoint, timeout=60) as cl:
        yield cl


def test_ping(client):
    p = client.ping()
    assert p.protocol_version == pb.PROTOCOL_VERSION_CURRENT
    assert "stories15" in p.model.lower()
    assert p.rtt_ms >= 0
    assert p.admin_port > 0  # troupe serve publishes its admin actor by default
    assert client.ping().nonce != p.nonce


def test_ping_names_no_admin_port_when_admin_is_off():
    s = Server("--admin-port=-1")
    try:
        with Client(s.endpoint, timeout=60) as cl:
            assert cl.ping().admin_port == 0
    finally:
        s.stop()


def test_greedy_equals_offline_generate(client):
    ref = offline_generate(PROMPT, 24)
    r = client.generate(PROMPT, max_tokens=24, stream=False)
    assert r.token_ids == ref["token_ids"]
    assert r.text == ref["text"]
    assert r.finish_reason == ref["finish_reason"] == "length"
    assert r.prompt_tokens == len(ref["prompt_token_ids"])
    assert r.completion_tokens == 24
    assert r.accepted
    # The same prompt as token ids gives the same answer.
    t = client.generate(ref["prompt_token_ids"], max_tokens=24, stream=False)
    assert t.token_ids == ref["token_ids"]


def test_embeddings_over_the_zeromq_protocol(client):
    a = client.generate(PROMPT, embedding=True, stream=False)
    assert a.finish_reason == "stop" and a.completion_tokens == 0 and a.token_ids == []
    assert len(a.embedding) == 288  # stories15M's hidden size
    assert abs(sum(v * v for v in a.embedding) - 1.0) < 1e-4
    assert client.generate(PROMPT, embedding=True, stream=False).embedding == a.embedding
    assert client.generate("A different story", embedding=True, stream=False).embedding != a.embedding
    with pytest.raises(TroupeError) as e:  # nothing is generated: generation options are refused
        client.generate(PROMPT, embedding=True, max_tokens=4, stream=False)
    assert "max_tokens does not apply" in str(e.value)


def test_stream_deltas_concatenate_to_final_text(client):
    ref = offline_generate(PROMPT, 32)
    stream = client.generate(PROMPT, max_tokens=32, temperature=0.0)
    chunks = list(stream)
    assert len(chunks) > 1
    assert all(ch.request_id == stream.request_id for ch in chunks)
    assert "".join(ch.text for ch in chunks) == stream.result.text == ref["text"]
    assert [t for ch in chunks for t in ch.token_ids] == stream.result.token_ids == ref["token_ids"]
    assert stream.result.finish_reason == "length"


def test_pipelined_requests_on_one_socket(client):
    a = client.generate("The cat", max_tokens=8)
    b = client.generate("The dog", max_tokens=8)
    rb, ra = b.wait(), a.wait()
    assert ra.request_id != rb.request_id
    assert ra.completion_tokens == rb.completion_tokens == 8


def test_cancel_mid_stream(client):
    stream = client.generate(PROMPT, max_tokens=200, ignore_eos=True)
    seen = 0
    for ch in stream:
        seen += len(ch.token_ids)
        if seen and seen < 200:
            assert stream.cancel()
            break
    r = stream.wait()
    assert r.finish_reason == "cancelled"
    assert 0 < r.completion_tokens < 200
    # Cancelling it again: no longer in flight (the server's UNKNOWN_REQUEST is dropped).
    assert not client.cancel(stream.request_id)
    assert client.ping().model


def test_empty_prompt_is_an_error(client):
    with pytest.raises(TroupeError) as e:
        client.generate("", max_tokens=4, stream=False, request_id=77)
    assert e.value.code == pb.INVALID_ARGUMENT
    assert e.value.request_id == 77
    assert "empty prompt" in e.value.message
    with pytest.raises(TroupeError) as e:
        list(client.generate([], max_tokens=4))
    assert e.value.code == pb.INVALID_ARGUMENT
    # The connection stays usable.
    assert client.generate("Hello", max_tokens=2, stream=False).completion_tokens == 2


def test_stop_string(client):
    ref = offline_generate(PROMPT, 32)
    word = ref["text"].split()[3]
    r = client.generate(PROMPT, max_tokens=32, stop=[word], stream=False)
    assert r.finish_reason == "stop"
    assert r.stop_matched == word
    assert word not in r.text and ref["text"].startswith(r.text)


def test_unsupported_version_raw(endpoint):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        m = pb.ClientMessage(protocol_version=99)
        m.ping.nonce = 1
        s.send(m.SerializeToString())
        assert s.poll(10000)
        reply = pb.ServerMessage.FromString(s.recv())
        assert reply.WhichOneof("body") == "error"
        assert reply.error.code == pb.UNSUPPORTED_VERSION
        assert not reply.error.has_request_id
    finally:
        s.close(0)


async def test_async_concurrent_requests(endpoint, client):
    prompts = ["The cat", "A little girl", "The sun was", "One day, Tim", PROMPT, "Lily liked"]
    expected = [client.generate(p, max_tokens=16, stream=False).token_ids for p in prompts]
    async with AsyncClient(endpoint, timeout=60) as acl:
        pong = await acl.ping()
        assert pong.protocol_version == pb.PROTOCOL_VERSION_CURRENT

        async def streamed(p):
            s = await acl.generate(p, max_tokens=16)
            text = "".join([ch.text async for ch in s])
            assert text == s.result.text
            return s.result

        results = await asyncio.gather(
            *(acl.generate(p, max_tokens=16, stream=False) for p in prompts),
            *(streamed(p) for p in prompts),
        )
        assert len({r.request_id for r in results}) == len(results)
        for i, r in enumerate(results):
            assert r.finish_reason == "length" and r.completion_tokens == 16
            assert r.token_ids == expected[i % len(prompts)], prompts[i % len(prompts)]

        # cancel and errors through the async client
        s = await acl.generate(PROMPT, max_tokens=200, ignore_eos=True)
        async for _ in s:
            assert await s.cancel()
            break
        assert (await s.wait()).finish_reason == "cancelled"
        with pytest.raises(TroupeError) as e:
            await acl.generate("", stream=False)
        assert e.value.code == pb.INVALID_ARGUMENT
