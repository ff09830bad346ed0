"""The HTTP process: FastAPI app, OpenAI protocol models, TokenizerManager.

`TokenizerManager` (tokenizer_manager.py) turns prompts into `TokenizedGenerateReq`s for the
scheduler and routes the detokenizer's `ReqStrOut`s back to the waiting request;
`create_app` (app.py) puts the OpenAI-compatible and native routes on top of it.
"""
