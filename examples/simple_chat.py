"""llama.cpp's examples/simple-chat/simple-chat.cpp, line for line, with pyllama's llama.h-style
API: an interactive chat using the model's built-in chat format (min-p 0.05, temp 0.8, dist).

    python examples/simple_chat.py -m model.gguf [-c context_size] [-ngl n_gpu_layers]
"""

import logging
import sys

import numpy as np

from pyllama import llama_api as L


def print_usage(argv):
    print("\nexample usage:")
    print(f"\n    {argv[0]} -m model.gguf [-c context_size] [-ngl n_gpu_layers]")
    print()


def main(argv):
    model_path = ""
    ngl = 99
    n_ctx = 2048

    # parse command line arguments
    i = 1
    while i < len(argv):
        try:
            if argv[i] == "-m":
                if i + 1 < len(argv):
                    i += 1
                    model_path = argv[i]
                else:
                    print_usage(argv)
                    return 1
            elif argv[i] == "-c":
                if i + 1 < len(argv):
                    i += 1
                    n_ctx = int(argv[i])
                else:
                    print_usage(argv)
                    return 1
            elif argv[i] == "-ngl":
                if i + 1 < len(argv):
                    i += 1
                    ngl = int(argv[i])
                else:
                    print_usage(argv)
                    return 1
            else:
                print_usage(argv)
                return 1
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            print_usage(argv)
            return 1
        i += 1
    if not model_path:
        print_usage(argv)
        return 1

    # only print errors
    logging.basicConfig(level=logging.ERROR, format="%(message)s", stream=sys.stderr)

    L.llama_backend_init()

    # initialize the model
    model_params = L.llama_model_default_params()
    model_params.n_gpu_layers = ngl

    model = L.llama_model_load_from_file(model_path.encode(), model_params)
    if model is None:
        print("main: error: unable to load model", file=sys.stderr)
        return 1

    vocab = L.llama_model_get_vocab(model)

    # initialize the context
    ctx_params = L.llama_context_default_params()
    ctx_params.n_ctx = n_ctx
    ctx_params.n_batch = n_ctx

    ctx = L.llama_init_from_model(model, ctx_params)
    if ctx is None:
        print("main: error: failed to create the llama_context", file=sys.stderr)
        return 1

    # initialize the sampler
    smpl = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(smpl, L.llama_sampler_init_min_p(0.05, 1))
    L.llama_sampler_chain_add(smpl, L.llama_sampler_init_temp(0.8))
    L.llama_sampler_chain_add(smpl, L.llama_sampler_init_dist(L.LLAMA_DEFAULT_SEED))

    out = sys.stdout.buffer

    # helper function to evaluate a prompt and generate a response
    def generate(prompt: bytes) -> bytes:
        response = b""

        is_first = L.llama_memory_seq_pos_max(L.llama_get_memory(ctx), 0) == -1

        # tokenize the prompt
        n_prompt_tokens = -L.llama_tokenize(vocab, prompt, len(prompt), None, 0, is_first, True)
        prompt_tokens = np.zeros(n_prompt_tokens, dtype=np.int32)
        if L.llama_tokenize(vocab, prompt, len(prompt), prompt_tokens, len(prompt_tokens), is_first, True) < 0:
            raise RuntimeError("failed to tokenize the prompt")

        # prepare a batch for the prompt
        batch = L.llama_batch_get_one(prompt_tokens, len(prompt_tokens))
        new_token = np.zeros(1, dtype=np.int32)
        buf = bytearray(256)
        while True:
            # check if we have enough space in the context to evaluate this batch
            n_ctx_ = L.llama_n_ctx(ctx)
            n_ctx_used = L.llama_memory_seq_pos_max(L.llama_get_memory(ctx), 0) + 1
            if n_ctx_used + batch.n_tokens > n_ctx_:
                out.write(b"\033[0m\n")
                out.flush()
                print("context size exceeded", file=sys.stderr)
                sys.exit(0)

            ret = L.llama_decode(ctx, batch)
            if ret != 0:
                raise RuntimeError(f"failed to decode, ret = {ret}")

            # sample the next token
            new_token_id = L.llama_sampler_sample(smpl, ctx, -1)

            # is it an end of generation?
            if L.llama_vocab_is_eog(vocab, new_token_id):
                break

            # convert the token to a string, print it and add it to the response
            n = L.llama_token_to_piece(vocab, new_token_id, buf, len(buf), 0, True)
            if n < 0:
                raise RuntimeError("failed to convert token to piece")
            piece = bytes(buf[:n])
            out.write(piece)
            out.flush()
            response += piece

            # prepare the next batch with the sampled token
            new_token[0] = new_token_id
            batch = L.llama_batch_get_one(new_token, 1)

        return response

    messages = []
    formatted = bytearray(L.llama_n_ctx(ctx))
    prev_len = 0
    while True:
        # get user input
        out.write(b"\033[32m> \033[0m")
        out.flush()
        user = sys.stdin.readline()
        if user.endswith("\n"):
            user = user[:-1]
        if not user:
            break

        tmpl = L.llama_model_chat_template(model, None)

        # add the user input to the message list and format it
        messages.append(L.llama_chat_message("user", user))
        new_len = L.llama_chat_apply_template(tmpl, messages, len(messages), True, formatted, len(formatted))
        if new_len > len(formatted):
            formatted = bytearray(new_len)
            new_len = L.llama_chat_apply_template(tmpl, messages, len(messages), True, formatted, len(formatted))
        if new_len < 0:
            print("failed to apply the chat template", file=sys.stderr)
            return 1

        # remove previous messages to obtain the prompt to generate the response
        prompt = bytes(formatted[prev_len:new_len])

        # generate a response
        out.write(b"\033[33m")
        response = generate(prompt)
        out.write(b"\n\033[0m")
        out.flush()

        # add the response to the messages
        messages.append(L.llama_chat_message("assistant", response))
        prev_len = L.llama_chat_apply_template(tmpl, messages, len(messages), False, None, 0)
        if prev_len < 0:
            print("failed to apply the chat template", file=sys.stderr)
            return 1

    # free resources
    L.llama_sampler_free(smpl)
    L.llama_free(ctx)
    L.llama_model_free(model)

    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
