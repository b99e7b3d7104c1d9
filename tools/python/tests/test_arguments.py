"""The Python client's argument checks and error ownership (issue 9,
defect 7): each bad argument is refused before anything is sent, with a
message naming the parameter; a request's errors belong to that request."""

import asyncio

import pytest

from troupe_client import AsyncClient, Client, TroupeError, client_pb2 as pb
from troupe_client import _common as c


def generate_of(frame: bytes):
    return pb.ClientMessage.FromString(frame).generate


def test_one_stop_string_is_not_split_into_characters():
    assert list(generate_of(c.build_generate(1, "x", stop="END")).stop) == ["END"]
    assert list(generate_of(c.build_generate(1, "x", stop=["a", "bc"])).stop) == ["a", "bc"]
    with pytest.raises(TypeError, match="stop"):
        c.build_generate(1, "x", stop=[1])


def test_logit_bias_is_a_map_of_token_ids_to_bounded_biases():
    g = generate_of(c.build_generate(1, "x", logit_bias={5: -100, 7: 2.5}))
    assert dict(g.sampling.logit_bias) == {5: -100.0, 7: 2.5}
    for bad in ({"5": 1}, {-1: 1}, {5: 101}, {5: "1"}, {5: True}):
        with pytest.raises(ValueError, match="logit_bias"):
            c.build_generate(1, "x", logit_bias=bad)


def test_latency_targets_and_the_prompt_class_reach_the_frame():
    g = generate_of(c.build_generate(1, "x", slo_ttft_ms=800, slo_tpot_ms=25, prompt_class="chat"))
    assert (g.slo_ttft_ms, g.slo_tpot_ms, g.prompt_class) == (800, 25, "chat")
    with pytest.raises(ValueError, match="slo_ttft_ms"):
        c.build_generate(1, "x", slo_ttft_ms=-1)
    with pytest.raises(TypeError, match="prompt_class"):
        c.build_generate(1, "x", prompt_class=3)


def test_bytes_are_not_a_prompt():
    with pytest.raises(TypeError, match="prompt: bytes"):
        c.build_generate(1, b"Once upon a time")


def test_bad_list_prompts_name_the_prompt():
    with pytest.raises(TypeError, match="prompt: item 0 is float"):
        c.build_generate(1, [1.5, 2.5])
    with pytest.raises(ValueError, match="prompt: chat message 0 has no 'content'"):
        c.build_generate(1, [{"role": "user"}])
    with pytest.raises(ValueError, match="prompt: token id -3"):
        c.build_generate(1, [1, -3])


def test_out_of_range_values_name_the_parameter():
    with pytest.raises(ValueError, match="max_tokens"):
        c.build_generate(1, "x", max_tokens=2**40)
    with pytest.raises(ValueError, match="seed"):
        c.build_generate(1, "x", seed=-1)
    with pytest.raises(ValueError, match="deadline_ms"):
        c.build_generate(1, "x", deadline_ms=-5)
    with pytest.raises(TypeError, match="temperature"):
        c.build_generate(1, "x", temperature="hot")


def test_timeouts_must_be_positive_or_none():
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        Client("tcp://127.0.0.1:9", timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        Client("tcp://127.0.0.1:9", timeout=0)
    with Client("tcp://127.0.0.1:9", timeout=None) as cl:
        with pytest.raises(ValueError, match="timeout"):
            cl.ping(timeout=-1)


def test_a_closed_client_says_so():
    cl = Client("tcp://127.0.0.1:9")
    cl.close()
    with pytest.raises(RuntimeError, match="closed"):
        cl.generate("x")
    with pytest.raises(RuntimeError, match="closed"):
        cl.ping()


def test_async_ping_timeout_has_a_message():
    async def main():
        async with AsyncClient("tcp://127.0.0.1:9", timeout=5) as acl:
            with pytest.raises(TimeoutError, match="no pong from tcp://127.0.0.1:9"):
                await acl.ping(timeout=0.2)

    asyncio.run(main())


def test_a_frame_too_large_belongs_to_its_own_request(endpoint):
    with Client(endpoint, timeout=60) as cl:
        huge = cl.generate("word " * 400_000, max_tokens=4)  # a 2 MB frame: over the 1 MiB limit
        healthy = cl.generate("Once upon a time", max_tokens=8)
        assert healthy.wait().finish_reason == "length"
        with pytest.raises(TroupeError) as e:
            huge.wait()
        assert e.value.code == pb.FRAME_TOO_LARGE
        assert e.value.request_id == huge.request_id
        assert huge.request_id not in cl._queues  # the id is free again
        assert cl.generate("Once", max_tokens=2, request_id=huge.request_id, stream=False).completion_tokens == 2
