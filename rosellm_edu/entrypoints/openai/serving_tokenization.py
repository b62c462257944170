# Generated from notebooks/07a_server_hardening.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from rosellm_edu.entrypoints.openai.errors import ERRORS, OpenAIError
from rosellm_edu.entrypoints.openai.protocol import (DetokenizeRequest, DetokenizeResponse, TokenizeRequest,
                                                     TokenizeResponse)
from rosellm_edu.entrypoints.openai.serving_engine import chat_prompt_ids, check_model, check_request, in_pool


# notebooks/07a_server_hardening.ipynb, cell 18
router = APIRouter()


# notebooks/07a_server_hardening.ipynb, cell 18
@router.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS)
async def tokenize(body: TokenizeRequest, raw: Request) -> JSONResponse:
    """vLLM's /tokenize: a prompt's token ids, or chat messages' through the chat template."""
    check_request(raw, body)
    if (body.prompt is None) == (body.messages is None):
        raise OpenAIError(400, "give either prompt or messages", "prompt")
    if body.messages is not None:
        ids = await in_pool(raw, chat_prompt_ids, [m.for_template() for m in body.messages],
                            body.add_generation_prompt)
    else:
        ids = await in_pool(raw, lambda tok, text: tok(text, add_special_tokens=body.add_special_tokens).input_ids,
                            body.prompt)
    strs = [raw.app.state.tokenizer.convert_ids_to_tokens(t) for t in ids] if body.return_token_strs else None
    return JSONResponse(TokenizeResponse(count=len(ids), max_model_len=raw.app.state.engine.engine.max_model_len,
                                         tokens=ids, token_strs=strs).model_dump())


# notebooks/07a_server_hardening.ipynb, cell 18
@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
async def detokenize(body: DetokenizeRequest, raw: Request) -> JSONResponse:
    check_model(raw, body.model)
    vocab = raw.app.state.engine.engine.vocab_size
    if not all(0 <= t < vocab for t in body.tokens):
        raise OpenAIError(400, f"tokens: token ids must be in [0, {vocab})", "tokens")
    text = await in_pool(raw, lambda tok, ids: tok.decode(ids), body.tokens)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump())
