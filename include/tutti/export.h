// Symbol visibility for the tutti shared library.
//
// libtutti is built with -fvisibility=hidden; only declarations marked
// TUTTI_API are exported, so internal classes cannot leak into the ABI.
#pragma once

#if defined(_WIN32)
#define TUTTI_API_EXPORT __declspec(dllexport)
#define TUTTI_API_IMPORT __declspec(dllimport)
#else
#define TUTTI_API_EXPORT __attribute__((visibility("default")))
#define TUTTI_API_IMPORT __attribute__((visibility("default")))
#endif

#if defined(TUTTI_STATIC)
#define TUTTI_API
#elif defined(TUTTI_BUILDING_LIBRARY)
#define TUTTI_API TUTTI_API_EXPORT
#else
#define TUTTI_API TUTTI_API_IMPORT
#endif
