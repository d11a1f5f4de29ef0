// The tensor index of a version-3 manifest ("layout": "once"): each
// tensor's dtype and global shape once, and each stored piece once.
//
//   "tensors": {"model/w": {"dtype": "F32", "shape": [8, 4],
//                           "pieces": [[0, 0, 64, "<xxh64>", {"flat": 0}],
//                                      [3, 128, 192, "<xxh64>", {"flat": 16}]]},
//               "opt/m":   {..., "pieces": [[1, 0, 16, "<xxh64>",
//                                            {"dim": 0, "offset": 2, "extent": 1}]]},
//               "step":    {..., "pieces": [[0, 64, 72, "<xxh64>", null]]}}
//
// A piece is [shard (the writer's rank), begin, end (bytes of that shard's
// data region), xxh64 of those bytes, placement]: null (the whole tensor),
// {"flat": offset} (elements [offset, offset + n) of the flattened tensor),
// or {"dim": d, "offset": o, "extent": e} (indices [o, o + e) of dimension
// d).  A loader plans from the index alone and opens only the shards it
// reads; each shard's header repeats its pieces, and the loader checks the
// two against each other when it opens one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/shard_geometry.h"
#include "checkpoint/shard_index.h"
#include "tutti/dtype.h"

namespace tutti {
namespace ckpt {

struct IndexPiece {
  int shard = 0;
  uint64_t begin = 0;  // bytes of the shard's data region
  uint64_t end = 0;
  uint64_t xxh64 = 0;
  Placement placement;
};

struct IndexTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;      // global
  std::vector<IndexPiece> pieces;  // by shard, then begin
};

using TensorIndex = std::map<std::string, IndexTensor>;

// What the index must agree with: one record per shard file.
struct ShardExtent {
  int rank = 0;
  uint64_t tensors = 0;
  uint64_t data_bytes = 0;
};

// A tensor as a rank's state describes it.
struct TensorDecl {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // global
};

// Building (rank 0, from the pieces every rank wrote).  kInvalidArgument
// naming the tensor when a piece's dtype or global shape differs from what
// the tensor already has (ranks that disagree about a tensor).
void declare_tensor(TensorIndex* index, const std::string& name, DType dtype,
                    const std::vector<int64_t>& shape, int rank);
void add_piece(TensorIndex* index, int shard, const StoredTensor& piece);
// Sorts pieces; kInvalidArgument naming the first tensor some of whose
// elements no rank wrote.
void finish_index(TensorIndex* index);

nlohmann::json index_to_json(const TensorIndex& index);
// Validates every field, each piece against its tensor and its shard, that
// each shard's pieces tile its data region exactly, and that every tensor
// is covered.  kCorrupt naming `path`.
TensorIndex parse_index(const nlohmann::json& tensors, const std::vector<ShardExtent>& shards,
                        const std::string& path);

// Elements of the tensor that no piece holds (0: covered), and where the
// first such gap starts.
uint64_t uncovered_elements(const IndexTensor& t, uint64_t* first_gap);
// True when no two pieces share an element (each stored once).
bool stored_once(const IndexTensor& t);

// Each shard's pieces (index == shard rank, `shards` entries) as the
// loader's StoredTensors, in data order.
std::vector<std::vector<StoredTensor>> pieces_by_shard(const TensorIndex& index, int shards);

}  // namespace ckpt
}  // namespace tutti
