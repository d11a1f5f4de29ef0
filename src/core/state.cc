#include "tutti/state.h"

namespace tutti {
Stateful::~Stateful() = default;
}  // namespace tutti
