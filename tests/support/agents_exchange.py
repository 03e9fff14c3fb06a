"""A two-turn exchange of the OpenAI Agents SDK, unchanged, against a server's Responses API:
``python agents_exchange.py BASE_URL MODEL API_KEY`` prints the two replies and their response
ids as JSON. Run by ``.venv/agents``'s Python (the SDK pins packages the project's own
environment cannot take), so it imports nothing of the project."""

from __future__ import annotations

import asyncio
import json
import sys

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI


async def main(url: str, model: str, key: str) -> None:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    agent = Agent(
        name="assistant",
        instructions="be brief",
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(max_tokens=8),
    )
    first = await Runner.run(agent, "hello there")
    second = await Runner.run(agent, "and then?", previous_response_id=first.last_response_id)
    replies = [first.final_output, second.final_output]
    ids = [first.last_response_id, second.last_response_id]
    print(json.dumps({"replies": replies, "ids": ids}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
