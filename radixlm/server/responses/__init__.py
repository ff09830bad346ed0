"""The OpenAI Responses API (/v1/responses), an adapter over the chat completions path."""
