#pragma once
// stub: ProcessGroupGloo.hpp includes this but uses nothing from it.
