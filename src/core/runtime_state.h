// Process-wide facts other layers need without depending on comm/: the world
// rank and size once tutti::init() has run (the one copy: log line prefixes,
// error messages and fault injection read it here).
#pragma once

namespace tutti {

// -1 before init().
int runtime_world_rank();
int runtime_world_size();
void set_runtime_world(int rank, int size);

}  // namespace tutti
