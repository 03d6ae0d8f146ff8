"""Per-request exceptions a step keeps must not keep Triton's request objects alive."""
import gc
import weakref

from triton_omni.runtime.errors import InvalidInput, forget_traceback


class Marker:       # stands for Triton's request objects, held by the adapter's frame
    pass


def _step():
    results = []
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise InvalidInput("max_tokens", "must be > 0") from inner
    except InvalidInput as exc:
        results.append(exc)          # as the steps do: one result per request, errors included
    return results


def _adapter(marker):
    return _step()


def test_a_kept_exception_frees_the_callers_frames_once_its_traceback_is_forgotten():
    gc.disable()    # what is freed must be freed by reference counting, not by a collection
    try:
        for forget in (False, True):
            marker = Marker()
            alive = weakref.ref(marker)
            results = _adapter(marker)
            del marker
            if forget:
                forget_traceback(results[0])
                assert results[0].__traceback__ is None and results[0].__cause__.__traceback__ is None
                assert str(results[0]) == "field 'max_tokens': must be > 0"
            del results
            # without forgetting, the cycle exception -> traceback -> frame -> list -> exception
            # keeps the caller's frame, and what it holds, until the garbage collector runs
            assert (alive() is None) == forget
            gc.collect()
            assert alive() is None
    finally:
        gc.enable()
