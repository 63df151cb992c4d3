// llama.cpp's llama-embedding (examples/embedding/embedding.cpp) for token ids, with the
// embeddings written in full float32 precision instead of printed with %1.7f, so pyllama's
// (pyllama.embedding.embed_token_lists) can be compared bit for bit.
//   stdin: one prompt per line, its token ids separated by spaces (as tokenized with
//          add_special=True, parse_special=True, which llama-embedding does)
//   OUT:   int32 n_embd_count, int32 n_embd, then n_embd_count * n_embd float32: one row per
//          token of every prompt with pooling none, else one row per prompt; unnormalized
// Settings as llama-embedding's defaults: n_ctx the model's training context (or NCTX),
// n_batch max(2048, n_ctx), n_ubatch 512, n_seq_max 256 with a unified KV cache, flash
// attention auto, all tokens outputs, prompts packed into one decode while they fit.
// Build against a llama.cpp build (e.g. the llama-cpp-python 0.3.36 sdist, GGML_NATIVE=OFF
// GGML_AVX2=ON GGML_FMA=ON GGML_F16C=ON for the AVX2 backend pyllama follows):
//   g++ -O2 -std=c++17 tools/llamacpp_embeddings.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//       -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o llamacpp_embeddings
//   ./llamacpp_embeddings MODEL.gguf none|mean|cls|last OUT.bin [THREADS] [NCTX] < tokens.txt
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static void noop_log(ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL none|mean|cls|last OUT.bin [THREADS] [NCTX] < tokens.txt\n", argv[0]);
        return 1;
    }
    llama_log_set(noop_log, nullptr);
    const std::string pool = argv[2];
    enum llama_pooling_type pt = LLAMA_POOLING_TYPE_NONE;
    if (pool == "mean") pt = LLAMA_POOLING_TYPE_MEAN;
    else if (pool == "cls") pt = LLAMA_POOLING_TYPE_CLS;
    else if (pool == "last") pt = LLAMA_POOLING_TYPE_LAST;
    else if (pool != "none") { fprintf(stderr, "bad pooling %s\n", pool.c_str()); return 1; }
    const int n_threads = argc > 4 ? atoi(argv[4]) : 2;
    const int n_ctx = argc > 5 ? atoi(argv[5]) : 0;

    std::vector<std::vector<llama_token>> prompts;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream is(line);
        std::vector<llama_token> t;
        long v;
        while (is >> v) t.push_back((llama_token) v);
        if (!t.empty()) prompts.push_back(t);
    }

    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx > 2048 ? n_ctx : 2048;  // llama-embedding raises n_batch to n_ctx
    cp.n_ubatch = 512;
    cp.n_seq_max = (uint32_t) llama_max_parallel_sequences();
    cp.kv_unified = true;
    cp.n_threads = cp.n_threads_batch = n_threads;
    cp.embeddings = true;
    cp.pooling_type = pt;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }
    const int n_embd = llama_model_n_embd_out(model);
    const int n_seq_max = (int) cp.n_seq_max;
    const int n_batch = (int) cp.n_batch;

    int n_rows = 0;
    for (auto & p : prompts) n_rows += pt == LLAMA_POOLING_TYPE_NONE ? (int) p.size() : 1;
    std::vector<float> out((size_t) n_rows * n_embd, 0.0f);

    llama_batch b = llama_batch_init(n_batch, 0, 1);
    int row = 0;       // first output row of the batch being packed
    int s = 0;         // sequences in it
    auto flush = [&]() {
        if (b.n_tokens == 0) return;
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_decode(ctx, b) < 0) { fprintf(stderr, "decode failed\n"); exit(1); }
        for (int i = 0; i < b.n_tokens; i++) {
            const float * e;
            int pos;
            if (pt == LLAMA_POOLING_TYPE_NONE) { e = llama_get_embeddings_ith(ctx, i); pos = row + i; }
            else { e = llama_get_embeddings_seq(ctx, b.seq_id[i][0]); pos = row + b.seq_id[i][0]; }
            if (!e) { fprintf(stderr, "no embedding\n"); exit(1); }
            memcpy(&out[(size_t) pos * n_embd], e, n_embd * sizeof(float));
        }
        row += pt == LLAMA_POOLING_TYPE_NONE ? b.n_tokens : s;
        b.n_tokens = 0;
        s = 0;
    };
    for (auto & p : prompts) {
        if ((int) p.size() > n_batch) { fprintf(stderr, "prompt longer than n_batch\n"); return 1; }
        if (b.n_tokens + (int) p.size() > n_batch || s >= n_seq_max) flush();
        for (size_t i = 0; i < p.size(); i++) {
            const int k = b.n_tokens++;
            b.token[k] = p[i]; b.pos[k] = (llama_pos) i; b.n_seq_id[k] = 1; b.seq_id[k][0] = s; b.logits[k] = 1;
        }
        s++;
    }
    flush();
    llama_batch_free(b);

    FILE * f = fopen(argv[3], "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", argv[3]); return 1; }
    const int32_t hdr[2] = {n_rows, n_embd};
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(out.data(), sizeof(float), out.size(), f);
    fclose(f);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
