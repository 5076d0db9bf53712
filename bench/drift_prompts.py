"""The seeded quality-drift prompt set (data/prompts/drift.jsonl): chat, long-context retrieval, code, tool calls.

`python -m bench.drift_prompts` rewrites the file; a test checks the committed file is what the seed gives.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.model import catalog

DRIFT_PROMPTS = catalog.DATA / "prompts" / "drift.jsonl"
SEED = 20261130

CHAT = [
    "Explain why the sky is blue at noon and red at sunset, in two short paragraphs.",
    "My flight was cancelled and the airline offers a voucher or a refund. Which should I take and why?",
    "Summarise the causes of the 2008 financial crisis for a high-school student.",
    "Give me a three-day itinerary for Kyoto in autumn with one rainy-day alternative.",
    "What is the difference between a Roth IRA and a traditional IRA?",
    "Write a haiku about a GPU running out of memory.",
    "How do I politely decline a meeting invitation from my manager's manager?",
    "Compare the French and the Russian revolutions in five bullet points.",
    "Explain TCP slow start to someone who knows what a packet is.",
    "Suggest a vegetarian dinner for six that can be prepared in under an hour.",
]
CODE = [
    "Write a Python function that merges overlapping intervals, with a docstring and its complexity.",
    "Write a SQL query returning, per customer, the three most recent orders with their totals.",
    "Fix the bug: `def mean(xs): return sum(xs) / len(xs) if xs else 0` returns an int for empty lists in "
    "a typed codebase expecting float. Show the corrected code and a test.",
    "Implement an LRU cache in Rust with get and put in O(1).",
    "Write a bash one-liner that prints the 10 largest files under the current directory.",
    "Write a TypeScript type that makes every nested property of an object optional.",
    "Write a Go HTTP handler that streams server-sent events with a heartbeat every 15 seconds.",
    "Refactor this into a list comprehension: result = []\nfor x in data:\n    if x % 3 == 0:\n        "
    "result.append(x * x)",
    "Write a Triton kernel that adds two vectors, with the launch code.",
    "Explain what this regex matches and give three examples: ^(?=.*\\d)(?=.*[a-z])[\\w-]{8,}$",
]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Search flights between two airports on a date",
        "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                                                        "destination": {"type": "string"},
                                                        "date": {"type": "string"}},
                       "required": ["origin", "destination", "date"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the repository and return its output",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
]
TOOL_ASKS = [
    "What's the weather in Lisbon right now, in Celsius?",
    "Find me a flight from SFO to NRT on 2026-12-18.",
    "Run the test suite of this repository and tell me what fails.",
    "Is it colder in Oslo or in Helsinki today?",
    "List the files changed in the last commit.",
    "Book nothing yet, but find flights from LHR to JFK on 2027-01-05.",
    "Check the weather in Mumbai in Fahrenheit.",
    "Show the git log of the last three commits.",
    "What's the weather in Cape Town?",
    "Search flights from CDG to SIN on 2027-02-14.",
]
WORDS = ("amber basalt cedar delta ember fjord granite harbor island juniper kelp lagoon meadow nectar orchard "
         "prairie quartz river summit tundra upland valley willow xenon yarrow zephyr").split()


def _haystack(rng: random.Random, words: int, needle: str) -> str:
    sentences = []
    while sum(len(s.split()) for s in sentences) < words:
        n = rng.randint(8, 16)
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
    sentences.insert(rng.randrange(len(sentences)), needle)
    return " ".join(sentences)


def build() -> list[dict]:
    rng = random.Random(SEED)
    prompts = [{"id": f"chat-{i:02d}", "kind": "chat", "messages": [{"role": "user", "content": text}],
                "max_tokens": 64} for i, text in enumerate(CHAT)]
    for i, words in enumerate((2000, 4000, 8000, 2000, 4000, 8000, 3000, 6000, 12000, 16000)):
        code = f"{rng.choice(WORDS)}-{rng.randint(1000, 9999)}"
        city = rng.choice(["Oslo", "Lima", "Hanoi", "Accra", "Quito", "Perth"])
        haystack = _haystack(rng, words, f"The access code for the {city} archive is {code}.")
        prompts.append({"id": f"long-{i:02d}", "kind": "long-context", "max_tokens": 32, "answer": code,
                        "messages": [{"role": "user", "content": haystack
                                      + f"\n\nWhat is the access code for the {city} archive? Answer with the code."}]})
    prompts += [{"id": f"code-{i:02d}", "kind": "code", "messages": [{"role": "user", "content": text}],
                 "max_tokens": 96} for i, text in enumerate(CODE)]
    prompts += [{"id": f"tool-{i:02d}", "kind": "tool-call", "tools": TOOLS, "max_tokens": 64,
                 "messages": [{"role": "system", "content": "You are an assistant that calls tools when useful."},
                              {"role": "user", "content": text}]} for i, text in enumerate(TOOL_ASKS)]
    return prompts


def write(path: Path = DRIFT_PROMPTS) -> None:
    path.write_text("".join(json.dumps(p, sort_keys=True) + "\n" for p in build()))


if __name__ == "__main__":
    write()
