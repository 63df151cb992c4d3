// llama.cpp's logits with a given KV cache type and flash-attention setting, for pyllama's
// tests/kernels/test_kv_types.py (make_kv_reference.py builds and runs this).
//   kv_logits MODEL OUT.f32 TYPE_K TYPE_V FA [one] -- TOKEN...
// TYPE_K / TYPE_V: ggml type names (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl);
// FA: -1 auto, 0 off, 1 on (llama_flash_attn_type). Settings as ../shared/reference:
// n_ctx 2048, n_batch 2048, n_ubatch 512, 2 threads. OUT gets float32 [n_tokens, n_vocab]
// (every position an output): one batch, or with "one" one llama_decode per token (the
// token-generation path). Exit code 5: llama_init_from_model refused the settings.
#include "llama.h"
#include "ggml.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static ggml_type type_of(const char * s) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && !strcmp(n, s)) return (ggml_type) t;
    }
    fprintf(stderr, "unknown type %s\n", s);
    exit(1);
}

int main(int argc, char ** argv) {
    const bool one = argc > 6 && !strcmp(argv[6], "one");
    const int dd = one ? 7 : 6;
    if (argc < dd + 1 || strcmp(argv[dd], "--") != 0) {
        fprintf(stderr, "usage: %s MODEL OUT TYPE_K TYPE_V FA [one] -- TOKEN...\n", argv[0]);
        return 1;
    }
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "model load failed\n"); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.type_k = type_of(argv[3]);
    cp.type_v = type_of(argv[4]);
    cp.flash_attn_type = (llama_flash_attn_type) atoi(argv[5]);
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context refused\n"); return 5; }
    std::vector<llama_token> toks;
    for (int i = dd + 1; i < argc; i++) toks.push_back(atoi(argv[i]));
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    llama_batch b = llama_batch_init((int32_t) toks.size(), 0, 1);
    const size_t step = one ? 1 : toks.size();
    for (size_t k0 = 0; k0 < toks.size(); k0 += step) {
        b.n_tokens = 0;
        for (size_t k = k0; k < k0 + step; k++) {
            const int i = b.n_tokens++;
            b.token[i] = toks[k]; b.pos[i] = (llama_pos) k; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
        }
        if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 4; }
        for (int i = 0; i < b.n_tokens; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), nv, f);
    }
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx); llama_model_free(model);
    return 0;
}
