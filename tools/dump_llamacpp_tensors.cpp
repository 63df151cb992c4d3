// Dump every contiguous f32 intermediate of llama.cpp's forward pass (full tensors, not
// the 3+3 values llama-eval-callback prints) for one batch of token ids, so pyllama's
// debug dump (Context.set_debug_dump(["*"])) can be compared element by element.
// Each file OUTDIR/NNNN_<name>_<op>_<k>.bin holds int64 ne[4] then the f32 data.
// Build against a llama.cpp build (e.g. the llama-cpp-python 0.3.36 sdist):
//   g++ -O2 -std=c++17 tools/dump_llamacpp_tensors.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//       -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o dump
//   ./dump MODEL.gguf OUTDIR 2 818 5279 529 7001 563
// Settings as ../shared/reference: n_ctx 2048, n_batch 2048, n_ubatch 512, 2 threads.
// DUMP_EMBD=1 runs as llama-embedding --pooling none does instead: embeddings on, every
// token an output, n_seq_max LLAMA_MAX_SEQ (256) with a unified KV cache, n_batch =
// n_ubatch = n_ctx (DUMP_NCTX, default 4096); DUMP_FA=0 turns flash attention off.
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>
static std::string g_dir;
static std::map<std::string,int> g_cnt;
static int g_seq = 0;
static bool cb(struct ggml_tensor * t, bool ask, void *) {
    if (ask) return true;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    std::string name = t->name;
    for (auto & c : name) if (c == ' ' || c == '(' || c == ')' || c == '/') c = '_';
    int k = g_cnt[name]++;
    char fn[512];
    snprintf(fn, sizeof fn, "%s/%04d_%s_%s_%d.bin", g_dir.c_str(), g_seq++, name.c_str(), ggml_op_desc(t), k);
    std::vector<char> buf(ggml_nbytes(t));
    ggml_backend_tensor_get(t, buf.data(), 0, buf.size());
    FILE * f = fopen(fn, "wb");
    int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    fwrite(ne, sizeof ne, 1, f);
    fwrite(buf.data(), 1, buf.size(), f);
    fclose(f);
    return true;
}
int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODEL OUTDIR TOKEN...\n", argv[0]); return 1; }
    g_dir = argv[2];
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    const char * embd = getenv("DUMP_EMBD");
    const bool embd_mode = embd && atoi(embd) != 0;
    if (embd_mode) {
        const char * nc = getenv("DUMP_NCTX");
        cp.n_ctx = nc ? atoi(nc) : 4096;
        cp.n_batch = cp.n_ubatch = cp.n_ctx;
        cp.n_seq_max = 256; cp.kv_unified = true;
        cp.embeddings = true; cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
    }
    const char * fa = getenv("DUMP_FA");
    if (fa) cp.flash_attn_type = atoi(fa) ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = cb; cp.cb_eval_user_data = nullptr;
    llama_context * ctx = llama_init_from_model(model, cp);
    std::vector<llama_token> toks;
    for (int i = 3; i < argc; i++) toks.push_back(atoi(argv[i]));
    llama_batch b = llama_batch_init((int32_t) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i]; b.pos[i] = (llama_pos) i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = embd_mode || i + 1 == toks.size();
    }
    b.n_tokens = (int32_t) toks.size();
    int r = llama_decode(ctx, b);
    llama_batch_free(b);
    fprintf(stderr, "decode %d, %d tensors\n", r, g_seq);
    llama_free(ctx); llama_model_free(model);
    return 0;
}
