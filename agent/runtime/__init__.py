"""`modelforge runtime`: the runtime worker beside the agent. One persistent llama-server
per device, local OpenAI-compatible endpoints, typed runtime jobs. It imports schemas/
and the agent package only, and never offers a shell or runs arbitrary commands."""
