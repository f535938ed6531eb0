// The precompiled header of the layers from autograd up: the standard headers of
// pch/std_pch.h and the tensor, which nearly all their files include; parsed once per library
// instead of once per file. Each file still includes what it uses (see pch/std_pch.h).
#include "pch/std_pch.h"

#include "core/tensor.h"
