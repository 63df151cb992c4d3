// llama.cpp's side of benchmarks/compare_embedding.py: llama-embedding's batching without its
// printing. Reads one text per line, tokenizes each (add_special, parse_special), packs them
// into batches of at most n_batch tokens and n_seq_max sequences as llama-embedding's main
// loop does, encodes each batch (llama_encode for encoder-only models, else llama_decode)
// and reads every pooled vector; prints the seconds of each round of the whole set.
//   embedding_llamacpp MODEL TEXTS.txt N_THREADS ROUNDS
// Context as llama-embedding's defaults for an encoder: n_ctx = the model's, n_batch =
// n_ubatch = 2048, n_seq_max 256 (unified KV cache), the file's pooling, flash attention auto.
#include "llama.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 5) { fprintf(stderr, "usage: %s MODEL TEXTS N_THREADS ROUNDS\n", argv[0]); return 1; }
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "model load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<std::vector<llama_token>> inputs;
    std::ifstream in(argv[2]);
    std::string line;
    while (std::getline(in, line)) {
        std::vector<llama_token> t(line.size() + 8);
        int n = llama_tokenize(vocab, line.c_str(), (int) line.size(), t.data(), (int) t.size(), true, true);
        t.resize(n);
        inputs.push_back(t);
    }
    const int n_thr = atoi(argv[3]), rounds = atoi(argv[4]);
    auto cp = llama_context_default_params();
    cp.n_ctx = 0; cp.n_batch = 2048; cp.n_ubatch = 2048; cp.n_seq_max = 256; cp.kv_unified = true;
    cp.n_threads = n_thr; cp.n_threads_batch = n_thr; cp.embeddings = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    const bool enc = llama_model_has_encoder(model) && !llama_model_has_decoder(model);
    const int n_batch = (int) llama_n_batch(ctx), n_seq_max = (int) llama_n_seq_max(ctx);
    llama_batch b = llama_batch_init(n_batch, 0, 1);
    double sink = 0;
    for (int r = 0; r < rounds; r++) {
        auto t0 = std::chrono::steady_clock::now();
        int s = 0;
        auto flush = [&]() {
            if (b.n_tokens == 0) return;
            llama_memory_clear(llama_get_memory(ctx), true);
            if ((enc ? llama_encode(ctx, b) : llama_decode(ctx, b)) != 0) { fprintf(stderr, "encode failed\n"); exit(2); }
            for (int k = 0; k < s; k++) sink += llama_get_embeddings_seq(ctx, k)[0];
            b.n_tokens = 0; s = 0;
        };
        for (auto & t : inputs) {
            if (b.n_tokens + (int) t.size() > n_batch || s >= n_seq_max) flush();
            for (size_t i = 0; i < t.size(); i++) {
                int k = b.n_tokens++;
                b.token[k] = t[i]; b.pos[k] = (llama_pos) i; b.n_seq_id[k] = 1; b.seq_id[k][0] = s; b.logits[k] = 1;
            }
            s++;
        }
        flush();
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("%.6f\n", dt);
        fflush(stdout);
    }
    fprintf(stderr, "checksum %g\n", sink);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
