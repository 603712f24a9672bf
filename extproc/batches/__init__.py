"""Files and batch APIs (docs/batches.md): OpenAI `/v1/files` + `/v1/batches` and Anthropic
`/v1/messages/batches`, each batch line run as an async task on the task engine (extproc/tasks)."""
