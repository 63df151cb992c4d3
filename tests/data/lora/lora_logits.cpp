// llama.cpp's logits with LoRA adapters and a control vector applied, for pyllama's
// tests/models/test_lora.py (make_lora_reference.py builds and runs this).
//   lora_logits MODEL OUT.f32 [--lora FILE SCALE]... [--cvec FILE SCALE]... [--cvec-range A B] -- TOKEN...
// Adapters go through llama_adapter_lora_init + llama_set_adapters_lora; control vectors
// through common_control_vector_load + llama_set_adapter_cvec with llama.cpp's CLI rules
// (range default [1, n_layer]). Settings as ../shared/reference: n_ctx 2048, n_batch 2048,
// n_ubatch 512 (or $LORA_LOGITS_N_UBATCH), 2 threads, default flash attention. OUT gets
// float32 [n_tokens, n_vocab] (every position an output).
#include "llama.h"
#include "common.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODEL OUT [--lora F S]... [--cvec F S]... [--cvec-range A B] -- TOKEN...\n", argv[0]); return 1; }
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "model load failed\n"); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    if (const char * nu = getenv("LORA_LOGITS_N_UBATCH")) { cp.n_ubatch = atoi(nu); }
    llama_context * ctx = llama_init_from_model(model, cp);
    std::vector<llama_adapter_lora *> loras;
    std::vector<float> scales;
    std::vector<common_control_vector_load_info> cvecs;
    int il_start = -1, il_end = -1;
    int i = 3;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (!strcmp(argv[i], "--lora")) {
            llama_adapter_lora * a = llama_adapter_lora_init(model, argv[i + 1]);
            if (!a) { fprintf(stderr, "lora load failed: %s\n", argv[i + 1]); return 2; }
            loras.push_back(a); scales.push_back((float) atof(argv[i + 2])); i += 2;
        } else if (!strcmp(argv[i], "--cvec")) {
            cvecs.push_back({(float) atof(argv[i + 2]), argv[i + 1]}); i += 2;
        } else if (!strcmp(argv[i], "--cvec-range")) {
            il_start = atoi(argv[i + 1]); il_end = atoi(argv[i + 2]); i += 2;
        } else { fprintf(stderr, "bad arg %s\n", argv[i]); return 1; }
    }
    if (!loras.empty()) llama_set_adapters_lora(ctx, loras.data(), loras.size(), scales.data());
    if (!cvecs.empty()) {
        if (il_start <= 0) il_start = 1;
        if (il_end <= 0) il_end = llama_model_n_layer(model);
        auto cv = common_control_vector_load(cvecs);
        if (cv.n_embd == -1) { fprintf(stderr, "cvec load failed\n"); return 3; }
        if (llama_set_adapter_cvec(ctx, cv.data.data(), cv.data.size(), cv.n_embd, il_start, il_end)) { fprintf(stderr, "cvec set failed\n"); return 3; }
    }
    std::vector<llama_token> toks;
    for (i++; i < argc; i++) toks.push_back(atoi(argv[i]));
    llama_batch b = llama_batch_init((int32_t) toks.size(), 0, 1);
    for (size_t k = 0; k < toks.size(); k++) {
        b.token[k] = toks[k]; b.pos[k] = (llama_pos) k; b.n_seq_id[k] = 1; b.seq_id[k][0] = 0; b.logits[k] = 1;
    }
    b.n_tokens = (int32_t) toks.size();
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 4; }
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    for (size_t k = 0; k < toks.size(); k++) fwrite(llama_get_logits_ith(ctx, (int32_t) k), sizeof(float), nv, f);
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx); llama_model_free(model);
    return 0;
}
