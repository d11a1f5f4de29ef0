// One agreement among the ranks of a group, for the elastic layer.
#pragma once

#include <cstdint>

#include "tutti/process_group.h"

namespace tutti {
namespace elastic {

// Collective: the largest `v` over `group` (an all-reduce MAX named `name`).
int64_t agree_max(ProcessGroup& group, int64_t v, const char* name);

}  // namespace elastic
}  // namespace tutti
