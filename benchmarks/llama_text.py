"""The text pipeline of `c2c bench handoff` on llama.cpp: the baseline a user with a fast engine would pick.

Used by ``handoff_sweep.py --text-engine llama.cpp``. The same model (the zoo's GGUF
as shipped, quantized), the same prompts rendered with the model's own chat
template, the same token counts:

1. the analyst reads the system turn, its role, the document and its notes (prefill);
2. it writes an N-token message for the writer (end of turn suppressed: exactly N);
3. the writer reads the system turn, its role, the message and the question (prefill;
   llama-cpp-python reuses the longest common token prefix of the previous prompt,
   as a llama.cpp server's prompt cache would);
4. it answers ``answer_tokens`` tokens.

One ``Llama`` context serves both agents, one after the other (as one llama-server
slot would). Needs ``llama-cpp-python`` (built from source by ``scripts/setup.sh``).
"""

from __future__ import annotations

import time


def _render(rt, turns: list[tuple[str, str]], generation: bool) -> str:
    text = rt.render_turn("system", turns[0][1]) if turns and turns[0][0] == "system" else ""
    for role, content in turns[1:] if text else turns:
        text += rt.render_turn(role, content)
    return text + (rt.generation_prompt() if generation else "")


def _generate(llm, tokens: list[int], n: int, *, no_eos: bool) -> tuple[list[int], float, float]:
    """(tokens, seconds to the first token, seconds for the rest) of a greedy generation of ``n``."""
    eos = llm.token_eos()

    def block_eos(_ids, scores):
        scores[eos] = -float("inf")
        return scores

    out, t0, first = [], time.perf_counter(), None
    for tok in llm.generate(tokens, top_k=1, top_p=1.0, temp=0.0, reset=False,
                            logits_processor=[block_eos] if no_eos else None):
        if first is None:
            first = time.perf_counter()
        if int(tok) == eos:
            break
        out.append(int(tok))
        if len(out) == n:
            break
    end = time.perf_counter()
    return out, (first or end) - t0, end - (first or end)


def text_pipeline(llm, rt, *, system: str, analyst_role: str, writer_role: str, document: str, notes: str,
                  message_prompt: str, question: str, message_tokens: int, answer_tokens: int) -> dict:
    """Run the four steps once on ``llm``; ``rt`` (the same model in transformers) renders the chat turns."""
    tok = lambda text: llm.tokenize(text.encode(), add_bos=False, special=True)  # noqa: E731
    analyst = _render(rt, [("system", system), ("system", analyst_role), ("user", "Material:\n" + document),
                           ("user", "My notes:\n" + notes), ("user", message_prompt)], True)
    llm.reset()
    msg, read_s, write_s = _generate(llm, tok(analyst), message_tokens, no_eos=True)
    message = llm.detokenize(msg).decode("utf-8", errors="replace")
    writer = _render(rt, [("system", system), ("system", writer_role), ("user", message), ("user", question)], True)
    answer, writer_read_s, answer_s = _generate(llm, tok(writer), answer_tokens, no_eos=True)
    return {"llama_text_pipeline_s": read_s + write_s + writer_read_s + answer_s,
            "llama_analyst_read_s": read_s, "llama_message_s": write_s, "llama_writer_read_s": writer_read_s,
            "llama_answer_s": answer_s, "llama_message_tokens": len(msg), "llama_answer_tokens": len(answer),
            "llama_analyst_prompt_tokens": len(tok(analyst)), "llama_writer_prompt_tokens": len(tok(writer)),
            "llama_answer": llm.detokenize(answer).decode("utf-8", errors="replace")}
