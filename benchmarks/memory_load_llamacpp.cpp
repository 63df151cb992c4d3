// llama.cpp side of benchmarks/compare_memory_load.py: model load time (mmap), context
// creation time, and peak RSS after the same workload pyllama's side runs: decode n_fill
// random tokens in n_batch pieces (the first one BOS), then n_gen single tokens (greedy
// over the logits row). Prints one JSON line. Built by compare_memory_load.py against
// libllama (llama.h from the llama-cpp-python sdist), nothing of llama.cpp is committed.
//   ./memory_load_llamacpp MODEL.gguf N_CTX N_FILL N_GEN THREADS
#include "llama.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static long status_kb(const char * key) {  // VmRSS / VmHWM from /proc/self/status, in kB
    FILE * f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, n) == 0 && line[n] == ':') { v = atol(line + n + 1); break; }
    }
    fclose(f);
    return v;
}

static double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

int main(int argc, char ** argv) {
    if (argc < 6) { fprintf(stderr, "usage: %s MODEL N_CTX N_FILL N_GEN THREADS\n", argv[0]); return 2; }
    const int n_ctx = atoi(argv[2]), n_fill = atoi(argv[3]), n_gen = atoi(argv[4]), n_threads = atoi(argv[5]);
    long rss_start = status_kb("VmRSS");
    llama_backend_init();
    llama_log_set([](enum ggml_log_level, const char *, void *) {}, nullptr);
    auto mp = llama_model_default_params();  // use_mmap = true
    auto t0 = std::chrono::steady_clock::now();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    double load_ms = ms_since(t0);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    long rss_load = status_kb("VmRSS");
    auto cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = n_threads;
    auto t1 = std::chrono::steady_clock::now();
    llama_context * ctx = llama_init_from_model(model, cp);
    double ctx_ms = ms_since(t1);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    long rss_ctx = status_kb("VmRSS");
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    srand(1);
    std::vector<llama_token> toks(2048);
    auto t2 = std::chrono::steady_clock::now();
    for (int done = 0; done < n_fill;) {
        int n = std::min(n_fill - done, 2048);
        for (int i = 0; i < n; i++) toks[i] = rand() % n_vocab;
        if (done == 0 && llama_vocab_get_add_bos(vocab)) toks[0] = llama_vocab_bos(vocab);
        if (llama_decode(ctx, llama_batch_get_one(toks.data(), n)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        done += n;
    }
    double fill_ms = ms_since(t2);
    long rss_fill = status_kb("VmRSS");
    llama_token tok = rand() % n_vocab;
    auto t3 = std::chrono::steady_clock::now();
    for (int i = 0; i < n_gen; i++) {
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        const float * lg = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int j = 1; j < n_vocab; j++) if (lg[j] > lg[best]) best = j;
        tok = best;
    }
    double gen_ms = ms_since(t3);
    printf("{\"impl\": \"llama.cpp\", \"load_ms\": %.2f, \"ctx_ms\": %.2f, \"fill_ms\": %.1f, \"gen_ms\": %.1f, "
           "\"rss_start_kb\": %ld, \"rss_load_kb\": %ld, \"rss_ctx_kb\": %ld, \"rss_fill_kb\": %ld, \"rss_end_kb\": %ld, "
           "\"peak_kb\": %ld}\n",
           load_ms, ctx_ms, fill_ms, gen_ms, rss_start, rss_load, rss_ctx, rss_fill, status_kb("VmRSS"), status_kb("VmHWM"));
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
