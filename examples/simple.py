"""llama.cpp's examples/simple/simple.cpp, line for line, with pyllama's llama.h-style API:
greedy completion of a prompt, printed token by token, timings on stderr.

    python examples/simple.py -m model.gguf [-n n_predict] [-ngl n_gpu_layers] [prompt]
"""

import logging
import sys
import time

import numpy as np

from pyllama import llama_api as L


def print_usage(argv):
    print("\nexample usage:")
    print(f"\n    {argv[0]} -m model.gguf [-n n_predict] [-ngl n_gpu_layers] [prompt]")
    print()


def main(argv):
    # llama.cpp logs its perf lines through its logger; ours is the "pyllama" logger
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("pyllama").setLevel(logging.INFO)

    # path to the model gguf file
    model_path = ""
    # prompt to generate text from
    prompt = "Hello my name is"
    # number of layers to offload to the GPU
    ngl = 99
    # number of tokens to predict
    n_predict = 32

    # parse command line arguments
    i = 1
    while i < len(argv):
        if argv[i] == "-m":
            if i + 1 < len(argv):
                i += 1
                model_path = argv[i]
            else:
                print_usage(argv)
                return 1
        elif argv[i] == "-n":
            if i + 1 < len(argv):
                i += 1
                try:
                    n_predict = int(argv[i])
                except ValueError:
                    print_usage(argv)
                    return 1
            else:
                print_usage(argv)
                return 1
        elif argv[i] == "-ngl":
            if i + 1 < len(argv):
                i += 1
                try:
                    ngl = int(argv[i])
                except ValueError:
                    print_usage(argv)
                    return 1
            else:
                print_usage(argv)
                return 1
        else:
            # prompt starts here
            break
        i += 1
    if not model_path:
        print_usage(argv)
        return 1
    if i < len(argv):
        prompt = " ".join(argv[i:])

    L.llama_backend_init()

    # initialize the model
    model_params = L.llama_model_default_params()
    model_params.n_gpu_layers = ngl

    model = L.llama_model_load_from_file(model_path.encode(), model_params)
    if model is None:
        print("main: error: unable to load model", file=sys.stderr)
        return 1

    vocab = L.llama_model_get_vocab(model)

    # tokenize the prompt
    prompt_b = prompt.encode("utf-8")
    # find the number of tokens in the prompt
    n_prompt = -L.llama_tokenize(vocab, prompt_b, len(prompt_b), None, 0, True, True)

    # allocate space for the tokens and tokenize the prompt
    prompt_tokens = np.zeros(n_prompt, dtype=np.int32)
    if L.llama_tokenize(vocab, prompt_b, len(prompt_b), prompt_tokens, len(prompt_tokens), True, True) < 0:
        print("main: error: failed to tokenize the prompt", file=sys.stderr)
        return 1

    # initialize the context
    ctx_params = L.llama_context_default_params()
    # n_ctx is the context size
    ctx_params.n_ctx = n_prompt + n_predict - 1
    # n_batch is the maximum number of tokens that can be processed in a single call to llama_decode
    ctx_params.n_batch = n_prompt
    # enable performance counters
    ctx_params.no_perf = False

    ctx = L.llama_init_from_model(model, ctx_params)
    if ctx is None:
        print("main: error: failed to create the llama_context", file=sys.stderr)
        return 1

    # initialize the sampler
    sparams = L.llama_sampler_chain_default_params()
    sparams.no_perf = False
    smpl = L.llama_sampler_chain_init(sparams)

    L.llama_sampler_chain_add(smpl, L.llama_sampler_init_greedy())

    # print the prompt token-by-token
    out = sys.stdout.buffer
    buf = bytearray(128)
    for tok in prompt_tokens:
        n = L.llama_token_to_piece(vocab, int(tok), buf, len(buf), 0, True)
        if n < 0:
            print("main: error: failed to convert token to piece", file=sys.stderr)
            return 1
        out.write(bytes(buf[:n]))

    # prepare a batch for the prompt
    batch = L.llama_batch_get_one(prompt_tokens, len(prompt_tokens))

    # main loop
    t_main_start = time.perf_counter()
    n_decode = 0
    n_pos = 0
    new_token = np.zeros(1, dtype=np.int32)
    while n_pos + batch.n_tokens < n_prompt + n_predict:
        # evaluate the current batch with the transformer model
        ret = L.llama_decode(ctx, batch)
        if ret:
            print(f"main : failed to eval, return code {ret}", file=sys.stderr)
            return 1

        n_pos += batch.n_tokens

        # sample the next token
        new_token_id = L.llama_sampler_sample(smpl, ctx, -1)

        # is it an end of generation?
        if L.llama_vocab_is_eog(vocab, new_token_id):
            break

        n = L.llama_token_to_piece(vocab, new_token_id, buf, len(buf), 0, True)
        if n < 0:
            print("main: error: failed to convert token to piece", file=sys.stderr)
            return 1
        out.write(bytes(buf[:n]))
        out.flush()

        # prepare the next batch with the sampled token
        new_token[0] = new_token_id
        batch = L.llama_batch_get_one(new_token, 1)

        n_decode += 1

    out.write(b"\n")
    out.flush()

    t_main_end = time.perf_counter()
    dt = t_main_end - t_main_start
    print(f"main: decoded {n_decode} tokens in {dt:.2f} s, speed: {n_decode / dt if dt > 0 else 0.0:.2f} t/s",
          file=sys.stderr)
    print(file=sys.stderr)

    L.llama_perf_sampler_print(smpl)
    L.llama_perf_context_print(ctx)

    print(file=sys.stderr)

    L.llama_sampler_free(smpl)
    L.llama_free(ctx)
    L.llama_model_free(model)

    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
