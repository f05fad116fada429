"""Compiles JSON Schemas with one grammar engine and checks texts against them.

Driven by tests/grammar_engines.rs, which passes the schemas dagloop itself composes
(`dagloop schema GOAL [--mode tools]`). Reads one JSON object on stdin:

    {"engine": "llama" | "llguidance" | "outlines",
     "gguf": "/path/model.gguf",            # llama only: a vocabulary to compile against
     "cases": [{"name": str, "schema": {...}, "valid": [text, ...], "invalid": [text, ...]}]}

and prints one JSON object on stdout:

    {"engine": str, "version": str,
     "results": [{"name": str, "compiled": bool, "error": str,
                  "valid": [bool, ...], "invalid": [bool, ...]}]}

where `valid[i]` / `invalid[i]` say whether the engine accepted that text (the whole text,
then end of sequence). A schema the engine cannot compile has `compiled: false` and the
engine's message in `error`.

How each engine is driven, as the servers drive it:
- llama: llama-cpp-python's JSON-Schema-to-GBNF converter (what its server calls for
  `response_format` and tools; on an exception the server silently falls back to plain JSON),
  then llama.cpp's grammar sampler built on the model's vocabulary. That converter puts an
  object's required members before its optional ones, so each text is first re-ordered the
  way it emits them (`llama_order`). Texts are tokenized with
  that vocabulary and fed token by token: each token must survive the sampler's mask, and the
  end-of-generation token must be allowed at the end.
- llguidance: `LLMatcher.grammar_from_json_schema`, validated and matched over a byte-level
  tokenizer (every byte a token).
- outlines: `outlines_core.json_schema.build_regex_from_schema`, then an `Index` over a
  vocabulary with one token per character, walked with a `Guide`.
"""

import json
import sys
import traceback


def _resolve(schema, root):
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema and seen < 32:
        ref = schema["$ref"]
        target = root
        for part in ref.lstrip("#").split("/")[1:]:
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {})
        schema, seen = target, seen + 1
    return schema if isinstance(schema, dict) else {}


def _branch_for(value, schema, root):
    """The first `anyOf` / `oneOf` branch an object value can match (by keys and consts)."""
    schema = _resolve(schema, root)
    for key in ("anyOf", "oneOf"):
        for b in schema.get(key, []):
            b = _branch_for(value, b, root)
            props = b.get("properties", {})
            if isinstance(value, dict):
                if b.get("type") not in (None, "object") or not set(b.get("required", [])) <= set(value):
                    continue
                if any("const" in _resolve(p, root) and value.get(k) != _resolve(p, root)["const"]
                       for k, p in props.items() if k in value):
                    continue
                return b
            if isinstance(value, list) and b.get("type") == "array":
                return b
        if schema.get(key):
            return {}
    return schema


def llama_order(value, schema, root):
    """The value with object members in the order llama.cpp's converter emits them: the
    required properties first, then the optional ones, each in the schema's order (its
    `prop_order` option is not exposed by the server)."""
    schema = _branch_for(value, schema, root)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        known = [k for k in props if k in value]
        keys = [k for k in known if k in required] + [k for k in known if k not in required]
        keys += [k for k in value if k not in props]
        return {k: llama_order(value[k], props.get(k, {}), root) for k in keys}
    if isinstance(value, list):
        return [llama_order(v, schema.get("items", {}), root) for v in value]
    return value


def llama_engine(req):
    import ctypes
    import math

    import llama_cpp as lc
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(req["gguf"].encode(), params)
    if not model:
        raise RuntimeError(f"cannot load the vocabulary of {req['gguf']}")
    vocab = lc.llama_model_get_vocab(model)
    eos = lc.llama_vocab_eos(vocab)

    def tokenize(text):
        data = text.encode()
        cap = len(data) + 16
        out = (lc.llama_token * cap)()
        n = lc.llama_tokenize(vocab, data, len(data), out, cap, False, False)
        if n < 0:
            raise RuntimeError("tokenization failed")
        return list(out[:n])

    def allowed(sampler, token):
        cand = (lc.llama_token_data * 1)()
        cand[0].id = token
        cand[0].logit = 0.0
        cand[0].p = 0.0
        arr = lc.llama_token_data_array(data=cand, size=1, selected=-1, sorted=False)
        lc.llama_sampler_apply(sampler, ctypes.byref(arr))
        return not math.isinf(cand[0].logit)

    def run(case):
        try:
            gbnf = json_schema_to_gbnf(json.dumps(case["schema"]))
        except Exception as e:  # what llama-cpp-python's server swallows
            return {"compiled": False, "error": f"json_schema_to_gbnf: {type(e).__name__}: {e}"}
        probe = lc.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        if not probe:
            return {"compiled": False, "error": "llama_sampler_init_grammar refused the GBNF"}
        lc.llama_sampler_free(probe)

        def accepts(text):
            text = json.dumps(
                llama_order(json.loads(text), case["schema"], case["schema"]),
                ensure_ascii=False,
                separators=(",", ":"),
            )
            sampler = lc.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
            try:
                for token in tokenize(text):
                    if not allowed(sampler, token):
                        return False
                    lc.llama_sampler_accept(sampler, token)
                return allowed(sampler, eos)
            finally:
                lc.llama_sampler_free(sampler)

        return {"compiled": True, "error": "", "accepts": accepts}

    return lc.__version__, run


def llguidance_engine(_req):
    import llguidance as llg

    class ByteTokenizer:
        eos_token_id = 256
        bos_token_id = None
        tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        special_token_ids = [256]

        def __call__(self, s):
            return list(s if isinstance(s, bytes) else s.encode())

    tok = llg.LLTokenizer(llg.TokenizerWrapper(ByteTokenizer()))

    def run(case):
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(case["schema"])
        except Exception as e:
            return {"compiled": False, "error": f"grammar_from_json_schema: {e}"}
        err = llg.LLMatcher.validate_grammar(grammar, tok)
        if err:
            return {"compiled": False, "error": err}

        def accepts(text):
            m = llg.LLMatcher(tok, grammar, log_level=0)
            if m.is_error():
                return False
            ok = m.consume_tokens(list(text.encode()))
            return bool(ok) and m.is_accepting() and not m.is_error()

        return {"compiled": True, "error": "", "accepts": accepts}

    return llg.__version__, run


def outlines_engine(req):
    import string
    from importlib.metadata import version

    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    chars = set(string.printable)
    for case in req["cases"]:
        for text in case.get("valid", []) + case.get("invalid", []):
            chars.update(text)
    chars = sorted(chars)
    ids = {c: i for i, c in enumerate(chars)}
    vocab = oc.Vocabulary(len(chars), {c: [i] for c, i in ids.items()})

    def run(case):
        try:
            regex = build_regex_from_schema(json.dumps(case["schema"]))
            index = oc.Index(regex, vocab)
        except Exception as e:
            return {"compiled": False, "error": f"{type(e).__name__}: {e}"}

        def accepts(text):
            guide = oc.Guide(index)
            try:
                for c in text:
                    guide.advance(ids[c], return_tokens=False)
            except Exception:
                return False
            return guide.is_finished()

        return {"compiled": True, "error": "", "accepts": accepts}

    return version("outlines-core"), run


ENGINES = {"llama": llama_engine, "llguidance": llguidance_engine, "outlines": outlines_engine}


def main():
    # A schema that makes an engine's automaton explode must fail the test, not the machine.
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (600, 600))
    req = json.load(sys.stdin)
    version, run = ENGINES[req["engine"]](req)
    results = []
    for case in req["cases"]:
        try:
            r = run(case)
        except Exception:
            r = {"compiled": False, "error": traceback.format_exc(limit=3)}
        acc = r.pop("accepts", None)
        r["name"] = case["name"]
        r["valid"] = [bool(acc(t)) for t in case.get("valid", [])] if acc else []
        r["invalid"] = [bool(acc(t)) for t in case.get("invalid", [])] if acc else []
        results.append(r)
    json.dump({"engine": req["engine"], "version": version, "results": results}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
