// hatch-precompile's entry: the compiled graph called from Python through ctypes.PyDLL
// (the GIL held; inductor_entry_impl releases it while it runs). `weights` is a list
// of tensor handles the caller keeps (the graph gets a new handle on each, so they
// survive the call); `inputs` a list of handles the graph takes over. Stable-ABI
// Python functions only, so the library loads in every CPython 3.x.
extern "C" PyObject* hatch_precompile_call(PyObject* weights, PyObject* inputs) {
    const Py_ssize_t n_weights = PyList_Size(weights), n_inputs = PyList_Size(inputs);
    std::vector<AtenTensorHandle> handles(n_weights + n_inputs);
    for (Py_ssize_t i = 0; i < n_weights; i++) {
        auto kept = reinterpret_cast<AtenTensorHandle>(PyCapsule_GetPointer(PyList_GetItem(weights, i), nullptr));
        if (aoti_torch_new_tensor_handle(kept, &handles[i]) != AOTI_TORCH_SUCCESS) {
            PyErr_SetString(PyExc_RuntimeError, "hatch-precompile: could not hand a weight to the compiled graph");
            return nullptr;
        }
    }
    for (Py_ssize_t i = 0; i < n_inputs; i++) {
        handles[n_weights + i] = reinterpret_cast<AtenTensorHandle>(PyCapsule_GetPointer(PyList_GetItem(inputs, i), nullptr));
    }
    std::array<AtenTensorHandle, HATCH_PRECOMPILE_OUTPUTS> outputs{};
    try {
        inductor_entry_impl(handles.data(), outputs.data());
    } catch (std::exception const& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    } catch (...) {
        PyErr_SetString(PyExc_RuntimeError, "the compiled graph raised a C++ exception that is not a std::exception");
        return nullptr;
    }
    PyObject* result = PyList_New(HATCH_PRECOMPILE_OUTPUTS);
    for (size_t i = 0; i < HATCH_PRECOMPILE_OUTPUTS; i++) {
        if (outputs[i] == nullptr) {  // an output that is not a tensor
            Py_IncRef(Py_None);
            PyList_SetItem(result, i, Py_None);
        } else {
            PyList_SetItem(result, i, PyCapsule_New(reinterpret_cast<void*>(outputs[i]), nullptr, nullptr));
        }
    }
    return result;
}
