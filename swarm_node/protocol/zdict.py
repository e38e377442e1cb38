"""The zstd dictionary of wire version 2: entropy tables and common byte strings of rollout-batch bodies.

A round's batch of a small model is a few hundred bytes of body, too little for zstd to pay for its own
Huffman and FSE tables; a dictionary supplies them (and the body's fixed slot layout). It was trained by
`python -m benchmarks.wire --train-dict` (zstandard.train_dictionary, 1,024 bytes, level 19) on 30 bodies
of trained tiny-preset batches (tiny-s and tiny-m, seeds 11-13, rounds 1-5, 16 arithmetic prompts x 8
completions of up to 6 tokens) with the swarm, task, tokenizer and model strings blanked, so it holds the
layout and the token and log-prob statistics, not one swarm's names. Batches the corpus did not cover
still decode and still compress; zstd emits its own tables when the dictionary's would cost more.

The bytes are part of the wire format: changing them needs a new major version (docs/protocol.md).
"""

from __future__ import annotations

import base64
import functools

import zstandard

SHA256 = "47fb85e9c28d70586ea880cacffc7847ce1bf2d67b101ab6f57397039053c200"
_B64 = (
    "N6Qw7N+rvUZPEFhoJa0B/KD/oP+gP7Gzs7MDSQIT1etD0c3yQ1kgiJxUUoKiZAXXasHVp71gHzyZ6NEIMUuPUGyt2QLmULdGZ3aR"
    "iIihI/fee0sp5ZYyBbMxSUw+pooCtHAAADTIUVWJkSTFIBADYQzCMCDFQogYQAACyBEQARAABAAAAIRob0WUiUgYC2IUh0EQiEHM"
    "Oc+MAAAAAAEAAAAEAAAACAAAANwAI6CgoKABYxDEGmFyaXRoOmlkOgAtAAFhcml0aDppZDoAKwABAcQQAAABAAEAAQABAAABAAAA"
    "AAHEIDBAFA82IiFISyZhY01WV1MVOEMbBQEiJAQSCgUlKh1IAcQQCAgICAgICAgICAgICAgICAHEEAYGBgYGBgYGBgYEBgUFBgYB"
    "xIAEBAQEBAQEBAICAgICAgICAwMDAwMDAwMEBAQEBAQEBAQEBAQEBAQEAwMDAwMDAwMEBAQEBAQEBAICAgICAgICAwMDAwMDAwMD"
    "AwMDAwMDAwMDAgMDAgMCAwMDAwMDAwMEBAMEBAQEBAICAgICAgICAwMDAwMDAwMEBAQEBAQEBAHEgAAhQSFCQUFBACEAIiEAISMA"
    "ERERETERMQARIkIiQkZCAEFBIUFDQUEAERERMzUxEQARIiIhQyJGAAAhACIlIyIAERERADQyMQARMREAMjExABEAEjEAMgAAERER"
    "MhEAMgAhESIhISFGACEhACEAIgAAMRExETQzEQAhIUEhIUJBxBAAAAAAAAAAAAAAAAAAAPA/AcQQAWAABBhhABYi6AACAAcjDA4B"
    "AcQOAQ0CAwEBAQEBAQEBAQQBAcUBBgcLAgkHDQUDAgQIDQgHAQYHDQYGAgoFDQoIAQYLDQwKAgwMDQoKAQsJDQsKAgsGDQUEAQgJ"
    "DQkKAgUKDQgCBA0GBwEGCQ0HAgQLDQQDAggNBgoCBwUNBQwCCgUNAgQJAAgABgAHAAoACAALBQAHAAkADAAKAAgAAgYLAAcDAAwA"
    "CgAEBAcABgACBQAGAAQACQAIAAQICwAJBAAMAAcAAwAFAAYABwAIAAoJAAoABgAFAAsEAAcEAAUAAwAGCgACDAAHAAUACwADAAoA"
    "CgYAAwAIAAUABwAJCgACBAsACQAFAAgACgAMAAYACAAJAAwACwACCAAHAAYABAACBwUABwAGAAQACAAGAcSqAAFcAEUApAA4ANsA"
    "ZAAJ9gCfAGcAcABzAIcAABxAAEMyADcAfQAAAUcATwADbABJAIgB2gCmAABZSQATVQAvAJUAYQBkAGMBRAFlAQ5sAHcApADUAGpc"
    "ABRaAGQASwBVXwAvRwD/AK4ARgB8AM4ADG8AZACxAHoAgwBxbwAABHMAVADaW4gAUQ=="
)


@functools.cache
def dictionary() -> zstandard.ZstdCompressionDict:
    """The dictionary object (immutable; zstandard copies what it needs into each (de)compressor)."""
    return zstandard.ZstdCompressionDict(base64.b64decode(_B64), dict_type=zstandard.DICT_TYPE_FULLDICT)
