"""An agent with no otel-rl code at all: two chat calls with the official openai client (zero-code tests)."""

from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "What is 2 + 3?"}]
reply = client.chat.completions.create(model=model, messages=messages).choices[0].message
messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "Thanks."}]
print(client.chat.completions.create(model=model, messages=messages).choices[0].message.content)
