// tutti: a distributed training runtime.  Include this for the whole API.
#pragma once

#define TUTTI_VERSION_MAJOR 0
#define TUTTI_VERSION_MINOR 1
#define TUTTI_VERSION_PATCH 0

#include "tutti/amp.h"
#include "tutti/checkpoint.h"
#include "tutti/comm.h"
#include "tutti/commit_tiers.h"
#include "tutti/config.h"
#include "tutti/data_parallel.h"
#include "tutti/device.h"
#include "tutti/dtype.h"
#include "tutti/elastic.h"
#include "tutti/error.h"
#include "tutti/log.h"
#include "tutti/mesh.h"
#include "tutti/optim.h"
#include "tutti/preemption.h"
#include "tutti/process_group.h"
#include "tutti/recovery.h"
#include "tutti/state.h"
#include "tutti/tensor.h"
#include "tutti/tensor_parallel.h"
#include "tutti/timeline.h"
#include "tutti/zero.h"
