// spm_shim.cc — SentencePiece behind the C interface of spm_shim.h.  Built only when
// configure finds libsentencepiece; nothing here throws across the C boundary.
#include "spm_shim.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

struct tsr_spm {
  sentencepiece::SentencePieceProcessor proc;
};

extern "C" int tsr_spm_load_bytes(tsr_spm **out, const void *bytes, size_t len, char *err,
                                  size_t errlen) {
  *out = nullptr;
  tsr_spm *p = new (std::nothrow) tsr_spm;
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return 1;
  }
  try {
    const auto st =
        p->proc.LoadFromSerializedProto(absl::string_view(static_cast<const char *>(bytes), len));
    if (!st.ok()) {
      snprintf(err, errlen, "%s", st.ToString().c_str());
      delete p;
      return 1;
    }
  } catch (const std::exception &e) {
    snprintf(err, errlen, "%s", e.what());
    delete p;
    return 1;
  }
  *out = p;
  return 0;
}

extern "C" void tsr_spm_free(tsr_spm **p) {
  if (!p) return;
  delete *p;
  *p = nullptr;
}

extern "C" int tsr_spm_pieces(const tsr_spm *p) { return p->proc.GetPieceSize(); }

extern "C" int tsr_spm_eos(const tsr_spm *p) { return p->proc.eos_id(); }

extern "C" int tsr_spm_piece_id(const tsr_spm *p, const char *piece) {
  try {
    const int id = p->proc.PieceToId(piece);
    // an unknown piece maps to <unk>: tell it apart from the piece itself
    return id >= 0 && p->proc.IdToPiece(id) == piece ? id : -1;
  } catch (...) {
    return -1;
  }
}

extern "C" int32_t *tsr_spm_encode(const tsr_spm *p, const char *text, size_t len, int64_t *n) {
  *n = 0;
  try {
    std::vector<int> ids;
    if (!p->proc.Encode(std::string(text, len), &ids).ok()) return nullptr;
    int32_t *out = static_cast<int32_t *>(malloc((ids.size() + 1) * sizeof(int32_t)));
    if (!out) return nullptr;
    for (size_t i = 0; i < ids.size(); i++) out[i] = ids[i];
    *n = static_cast<int64_t>(ids.size());
    return out;
  } catch (...) {
    return nullptr;
  }
}

extern "C" char *tsr_spm_decode(const tsr_spm *p, const int32_t *ids, int64_t n, size_t *len) {
  *len = 0;
  try {
    std::vector<int> v(ids, ids + n);
    std::string text;
    if (!p->proc.Decode(v, &text).ok()) return nullptr;
    char *out = static_cast<char *>(malloc(text.size() + 1));
    if (!out) return nullptr;
    memcpy(out, text.data(), text.size());
    out[text.size()] = 0;
    *len = text.size();
    return out;
  } catch (...) {
    return nullptr;
  }
}
