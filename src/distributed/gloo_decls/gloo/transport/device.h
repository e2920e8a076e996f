#pragma once
// stub: only the names are needed (held via shared_ptr / unique_ptr).
namespace gloo {
namespace transport {
class Device;
class Context;
class Pair;
class UnboundBuffer;
} // namespace transport
} // namespace gloo
